//go:build !linux

package main

import "time"

// preciseSleep is time.Sleep where nanosleep(2) is not wired up (the bench
// runs on Linux; this keeps it building elsewhere).
func preciseSleep(d time.Duration) { time.Sleep(d) }
