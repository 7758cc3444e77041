package txproducer_test

import (
	"context"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/txproducer"
)

// patchedClient reports whether this binary links the patched
// rocketmq-client-go (go.mod's replace, third_party/) or the upstream one,
// which is what a service that imports rmqtx builds
// (scripts/upstream-mod.sh). A test binary carries no module list, so it
// asks where the client's code was compiled from: the upstream module's
// path carries its version (...@v2.1.3-...), a replace directory does not.
func patchedClient(t *testing.T) bool {
	t.Helper()
	fn := runtime.FuncForPC(reflect.ValueOf(producer.NewTransactionProducer).Pointer())
	require.NotNil(t, fn)
	file, _ := fn.FileLine(fn.Entry())
	require.Contains(t, file, "producer", "cannot tell where the client was compiled from")
	return !strings.Contains(file, "rocketmq-client-go/v2@")
}

// TestLifecycleLeak measures what a producer's Start and Shutdown leave
// behind, over 100 lifecycles in one process. The upstream client's
// transactional producer ranges over a channel that nothing closes, so its
// check goroutine, and what it references, outlives Shutdown; patch 2
// (third_party/rocketmq-client-go/PATCHES.md) ends it. On the patched client
// nothing may stay; on the upstream one exactly one check goroutine per
// lifecycle, and no other goroutine per lifecycle, stays. The heap retained per lifecycle
// is logged for the README (not parallel: it counts goroutines and heap
// process-wide).
func TestLifecycleLeak(t *testing.T) {
	b := setup(t, 1)
	patched := patchedClient(t)
	cfg := b.config()
	cfg.WarmupTopics = nil // not needed to start the check goroutine
	ctx := context.Background()
	lifecycle := func() {
		p, err := txproducer.New(cfg)
		require.NoError(t, err)
		require.NoError(t, p.Start(ctx))
		require.NoError(t, p.Shutdown(ctx))
	}
	// memory is the heap in use after a collection plus the goroutine
	// stacks: a retained goroutine holds both.
	memory := func() (heap, stacks int64) {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return int64(m.HeapAlloc), int64(m.StackInuse)
	}
	expectLoops := 0
	if !patched {
		expectLoops = 1
	}
	// One lifecycle first: what the client sets up once per process (its
	// client table, logger, pools) is not per lifecycle. Its check
	// goroutine may not have run yet when Shutdown returns, so the count
	// is awaited, not read at once.
	before := checkLoops()
	lifecycle()
	loops0 := before + expectLoops
	// A client's start-up goroutines sleep up to 10 s before they look at
	// its shutdown: the baseline is taken once those of the collector and
	// the first lifecycle have ended.
	testenv.Eventually(t, 60*time.Second, "the first lifecycle's goroutines to settle", func() bool {
		return checkLoops() == loops0 && clientStartSleepers() == 0
	})
	g0, sig0 := runtime.NumGoroutine(), goroutineKinds()
	h0, s0 := memory()

	const lifecycles = 100
	for range lifecycles {
		lifecycle()
	}
	wantLoops := loops0 + expectLoops*lifecycles
	// The client's goroutines end a moment after Shutdown returns. Other
	// goroutines of the process (the test's collector starts statistics
	// goroutines lazily, the database pool) come and go by a few, so a leak
	// is a kind of goroutine that grew by half the lifecycles or more.
	var grown string
	testenv.Eventually(t, 60*time.Second, "only the check goroutines to stay", func() bool {
		grown = ""
		for kind, n := range goroutineKinds() {
			if n-sig0[kind] >= lifecycles/2 && !strings.Contains(kind, "checkTransactionState") {
				grown = kind
			}
		}
		return checkLoops() == wantLoops && grown == "" && clientStartSleepers() == 0
	})
	retained := runtime.NumGoroutine() - g0
	h1, s1 := memory()
	heapPer, stackPer := (h1-h0)/lifecycles, (s1-s0)/lifecycles
	perLifecycle := heapPer + stackPer
	client := "patched"
	if !patched {
		client = "upstream"
	}
	t.Logf("COUNTS lifecycle leak (%s client): lifecycles=%d check_goroutines_retained=%d goroutines_retained=%d retained_per_lifecycle: heap=%d B stacks=%d B",
		client, lifecycles, checkLoops()-loops0, retained, heapPer, stackPer)
	require.Equal(t, expectLoops*lifecycles, checkLoops()-loops0)
	// The README's bound for the upstream client: measured about 17 KiB per
	// lifecycle (a goroutine's stack and the producer it references).
	require.Less(t, perLifecycle, int64(64<<10), "memory retained per lifecycle")
}

// clientStartSleepers counts the client's start-up goroutines still in
// their first sleep (internal.(*rmqClient).Start sleeps 10 ms to 10 s before
// its periodic tasks first run and look at the client's shutdown).
func clientStartSleepers() int {
	n := 0
	for kind, c := range goroutineKinds() {
		if strings.HasPrefix(kind, "time.Sleep <- ") && strings.Contains(kind, "rmqClient).Start") {
			n += c
		}
	}
	return n
}

// goroutineKinds counts the process's goroutines by kind: the function
// they run now and the function that started them.
func goroutineKinds() map[string]int {
	buf := make([]byte, 1<<24)
	buf = buf[:runtime.Stack(buf, true)]
	kinds := map[string]int{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		var top, creator string
		for _, l := range strings.Split(g, "\n")[1:] {
			if l == "" || strings.HasPrefix(l, "\t") {
				continue
			}
			if c, ok := strings.CutPrefix(l, "created by "); ok {
				creator, _, _ = strings.Cut(c, " in goroutine")
			} else if top == "" {
				top = l[:max(strings.LastIndex(l, "("), 0)]
			}
		}
		kinds[top+" <- "+creator]++
	}
	return kinds
}
