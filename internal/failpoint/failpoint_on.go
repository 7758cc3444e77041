//go:build failpoints

package failpoint

import (
	"os"
	"syscall"
)

// Enabled reports whether this binary was built with failpoints.
const Enabled = true

var armed = os.Getenv(EnvVar)

// Inject kills the process with SIGKILL when name is the armed failpoint.
func Inject(name string) {
	if armed != "" && armed == name {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // never returns: the signal is on its way
	}
}
