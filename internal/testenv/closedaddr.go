package testenv

import (
	"net"
	"testing"
)

// ClosedAddr is a 127.0.0.1 address nothing listens on: a port the kernel
// handed out and the test closed at once, so a dial is refused. For tests
// of what a wrong address does (a Start that must fail and say why).
func ClosedAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testenv: listen: %v", err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return addr
}
