//go:build failpoints

package faultsuite

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/txproducer"
)

// The restart tests are not parallel: they stop a private service, which
// would break any other scenario running at the same time. Go runs every
// non-parallel top-level test before the parallel ones.

// TestRestartBroker SIGKILLs the private broker while two producer instances,
// an outbox dispatcher and two consumer instances run a load, then starts it
// again. Sends during the outage fail with txproducer.ErrSend; afterwards
// they succeed again; nothing committed is lost, nothing rolled back is
// delivered, nothing is applied twice.
func TestRestartBroker(t *testing.T) {
	restartUnderLoad(t, "broker-restart", "broker",
		func() { mustService(t, "kill9", "broker") },
		func() { mustComeBack(t, "broker") })
}

// TestRestartMariaDB stops and restarts the private MariaDB while the load
// runs. Sends fail with txproducer.ErrDatabase (or ErrCommitUnknown, or
// ErrSend when a check-back could not answer); the txlog decides each one.
func TestRestartMariaDB(t *testing.T) {
	restartUnderLoad(t, "mariadb-restart", "mariadb",
		func() { mustService(t, "down", "mariadb") },
		func() { mustComeBack(t, "mariadb") })
}

func mustService(t *testing.T, args ...string) {
	t.Helper()
	require.NotNil(t, private, "the restart tests need the suite's private services (started by TestMain)")
	start := time.Now()
	out, err := private.run(args...)
	require.NoError(t, err, "services.sh %v:\n%s", args, out)
	t.Logf("services.sh %v took %s", args, time.Since(start).Round(100*time.Millisecond))
}

// mustComeBack restarts service and fails the test with a failure of its
// own kind when it is not usable again within the script's bound
// (RMQTX_WAIT_SECONDS, 180 s): a restart that does not come back is an
// environment fault to fix (store size, heap, readiness check), never a
// finding about the invariants, and it is never retried.
func mustComeBack(t *testing.T, service string) {
	t.Helper()
	start := time.Now()
	out, err := private.run("up", service)
	if err != nil {
		report.restartFailed(service, time.Since(start))
		t.Fatalf("RESTART FAILED: the %s did not come back within %s of its restart (services.sh up %s: %v):\n%s",
			service, time.Since(start).Round(time.Second), service, err, out)
	}
	t.Logf("services.sh up %s took %s", service, time.Since(start).Round(100*time.Millisecond))
}

func restartUnderLoad(t *testing.T, name, service string, fault, recover func()) {
	testenv.Integration(t) // skips under -short
	require.NotNil(t, private, "the restart tests need the suite's private services (started by TestMain)")
	b := newBed(t, name)
	// Whatever happens, leave the service running for the next tests.
	t.Cleanup(func() { _, _ = private.run("up", service) })
	p1, p2 := b.startProducer(t), b.startProducer(t)
	b.startConsumer(t, "c1")
	b.startConsumer(t, "c2")
	d := b.startDispatcher(t, outbox.Config{Name: "obx-" + service, PollInterval: 200 * time.Millisecond, LeaseDuration: 5 * time.Second})

	target := int64(cfg.tx / 4)
	if target < 40 {
		target = 40
	}
	var okAtRecovery int64
	recoveredCh := make(chan struct{})
	minAfter := target / 4
	l := b.startLoad([]*txproducer.Producer{p1, p2}, d, 10, cfg.workers, nil, func(l *load) bool {
		select {
		case <-recoveredCh:
			return l.n.Load() >= target && l.ok.Load()-okAtRecovery >= minAfter
		default:
			return false
		}
	})
	t.Cleanup(l.stopAndWait)

	waitFor(t, 3*time.Minute, "a third of the load before the fault", func() bool { return l.n.Load() >= target/3 && l.ok.Load() > 0 })
	errsAtFault, nAtFault := l.errs.Load(), l.n.Load()
	faultAt := time.Now()
	fault()
	// The outage must be visible to the producers before the service returns.
	waitFor(t, 60*time.Second, "errors surfaced by the producers during the outage", func() bool {
		return l.errs.Load() >= errsAtFault+int64(cfg.workers)
	})
	recover()
	outage := time.Since(faultAt)
	errsAtRecovery, nAtRecovery := l.errs.Load(), l.n.Load()
	okAtRecovery = l.ok.Load()
	close(recoveredCh)
	// Recovery: the load finishes by itself once enough Sends succeed again.
	done := make(chan struct{})
	go func() { l.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Minute):
		t.Fatalf("the producers did not recover: %d committed Sends after the restart, want %d", l.ok.Load()-okAtRecovery, minAfter)
	}
	recovered := l.ok.Load() - okAtRecovery

	b.mu.Lock()
	untyped := b.sendErrs["untyped"]
	errs := map[string]int{}
	for k, v := range b.sendErrs {
		errs[k] = v
	}
	b.mu.Unlock()
	require.Zero(t, untyped, "every Send error is one of txproducer's typed errors: %v", errs)
	require.Positive(t, errsAtRecovery-errsAtFault, "the outage surfaced errors")
	switch service {
	case "broker":
		require.Positive(t, errs["ErrSend"], "a broker outage surfaces as txproducer.ErrSend: %v", errs)
	case "mariadb":
		require.Positive(t, errs["ErrDatabase"]+errs["ErrCommitUnknown"]+errs["outbox enqueue (database)"], "a database outage surfaces as txproducer.ErrDatabase or ErrCommitUnknown: %v", errs)
	}
	b.sc.note("%s stopped, usable again (script returned) after %s: attempts before/in that window/after %d/%d/%d; %d errors during the outage; %d committed after the restart",
		service, outage.Round(100*time.Millisecond), nAtFault, nAtRecovery-nAtFault, l.n.Load()-nAtRecovery, errsAtRecovery-errsAtFault, recovered)
	b.verify(t, 4*time.Minute)
}

// waitFor polls cond until it holds or timeout passes (a bounded condition
// wait, never a fixed sleep).
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
