//go:build linux

package main

import (
	"syscall"
	"time"
)

// preciseSleep sleeps for d with nanosleep(2): the runtime's timers wake an
// otherwise idle process through epoll_wait, whose timeout is in whole
// milliseconds, so time.Sleep(500µs) sleeps about 1 ms there; nanosleep
// wakes within the kernel's timer slack (50 µs by default).
func preciseSleep(d time.Duration) {
	if d <= 0 {
		return
	}
	ts := syscall.NsecToTimespec(int64(d))
	for {
		var rem syscall.Timespec
		if err := syscall.Nanosleep(&ts, &rem); err != syscall.EINTR {
			return
		}
		ts = rem // a signal (e.g. the runtime's preemption) cut it short
	}
}
