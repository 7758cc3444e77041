//go:build !failpoints

// Package failpoint lets crash tests kill a process abruptly at a named point
// in the code. In a normal build Inject is an empty function that the
// compiler inlines away, so production pays nothing. Build with
// `-tags failpoints` and set RMQTX_FAILPOINT=<name> to arm one point: the
// process then sends itself SIGKILL when it reaches that point.
package failpoint

// Enabled reports whether this binary was built with failpoints.
const Enabled = false

// Inject is a no-op in production builds.
func Inject(string) {}
