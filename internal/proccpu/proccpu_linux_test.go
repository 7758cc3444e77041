package proccpu

import (
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// ThreadsCPU counts a named thread's CPU in the part its name's prefix
// picks, and in the total: how the bench tells the broker's network
// threads from the rest of its JVM.
func TestThreadsCPU(t *testing.T) {
	named := make(chan struct{})
	var done atomic.Bool
	go func() {
		runtime.LockOSThread() // the thread ends with the goroutine: no other goroutine runs under its name
		name := []byte("rmqtxburn0\x00")
		_, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_NAME, uintptr(unsafe.Pointer(&name[0])), 0)
		if errno != 0 {
			panic(errno)
		}
		close(named)
		for !done.Load() { // burn CPU under the name until told to stop
		}
	}()
	<-named
	deadline := time.Now().Add(30 * time.Second)
	var th Threads
	for th.Picked < 5*time.Second/ClockTick {
		require.True(t, time.Now().Before(deadline), "the named thread used no CPU in 30 s")
		var ok bool
		th, ok = ThreadsCPU(syscall.Getpid(), "NettyServer", "rmqtxburn")
		require.True(t, ok)
		runtime.Gosched()
	}
	done.Store(true)
	require.GreaterOrEqual(t, th.Total, th.Picked)
	require.Positive(t, th.Matched, "the named thread is counted")
	none, ok := ThreadsCPU(syscall.Getpid(), "no-such-thread")
	require.True(t, ok)
	require.Zero(t, none.Picked)
	require.Zero(t, none.Matched)
	_, ok = ThreadsCPU(1 << 30)
	require.False(t, ok, "no such process")
}
