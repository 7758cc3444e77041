package testenv

import (
	"fmt"
	"reflect"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/jmoiron/sqlx"
)

// Goroutine-leak checks after lifecycles with traffic (go.mod has no
// go.uber.org/goleak; this is its IgnoreCurrent + VerifyNone, with the
// client's known leftovers listed by name and bounded by count).
//
// A check takes a baseline of the goroutines alive after one warm-up
// lifecycle (what a process sets up once: the client's instance table, a
// database pool's opener, the test's collector), runs the lifecycles, and
// then waits until every goroutine started since the baseline has ended,
// except the leftovers it names, each at most the number it allows. Waiting
// is on that condition, never a fixed sleep: the client's goroutines end a
// moment after Shutdown returns, and some sleep up to 10 s before they look
// at it. The test that uses it must not be parallel: it judges every
// goroutine of the process (go test runs parallel tests only after the
// sequential ones, so nothing else starts goroutines meanwhile).

// Leftover is a goroutine a lifecycle may leave behind on purpose or
// because of code rmqtx does not own.
type Leftover struct {
	// Func matches a goroutine whose stack holds a frame of a function
	// whose name contains Func.
	Func string
	// PerLifecycle goroutines may stay per lifecycle; Once in all.
	PerLifecycle, Once int
	// Why it may stay (logged with the counts).
	Why string
}

// Times is l for a lifecycle that runs n clients, each leaving it behind:
// n times the counts.
func (l Leftover) Times(n int) Leftover {
	l.PerLifecycle, l.Once = n*l.PerLifecycle, n*l.Once
	l.Why = fmt.Sprintf("%s (x%d: %d clients per lifecycle)", l.Why, n, n)
	return l
}

// Goroutine is one goroutine of a stack dump.
type Goroutine struct {
	ID    int
	Stack string // the goroutine's dump, header included
}

// Entry is the function the goroutine was started with (its bottom frame),
// and Top the one it runs now.
func (g Goroutine) Entry() string { fs := g.frames(); return fs[len(fs)-1] }

// Top is the function the goroutine runs now.
func (g Goroutine) Top() string { return g.frames()[0] }

func (g Goroutine) frames() []string {
	var out []string
	for _, l := range strings.Split(g.Stack, "\n")[1:] {
		if l == "" || strings.HasPrefix(l, "\t") || strings.HasPrefix(l, "created by ") {
			continue
		}
		if i := strings.LastIndex(l, "("); i > 0 {
			l = l[:i]
		}
		out = append(out, l)
	}
	if len(out) == 0 {
		out = []string{"?"}
	}
	return out
}

func (g Goroutine) has(fn string) bool {
	for _, f := range g.frames() {
		if strings.Contains(f, fn) {
			return true
		}
	}
	return false
}

// Goroutines returns every goroutine of the process but the caller's.
func Goroutines() []Goroutine {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []Goroutine
	for i, s := range strings.Split(string(buf), "\n\n") {
		if i == 0 { // the caller's own
			continue
		}
		head, _, _ := strings.Cut(s, " [")
		id, err := strconv.Atoi(strings.TrimPrefix(head, "goroutine "))
		if err != nil {
			continue
		}
		out = append(out, Goroutine{ID: id, Stack: s})
	}
	return out
}

// LeakBaseline is the set of goroutines alive when a leak check begins.
type LeakBaseline map[int]bool

// TakeLeakBaseline records the goroutines alive now.
func TakeLeakBaseline() LeakBaseline {
	b := LeakBaseline{}
	for _, g := range Goroutines() {
		b[g.ID] = true
	}
	return b
}

// leaks returns the goroutines started since b that no leftover allows,
// and how many each leftover took.
func (b LeakBaseline) leaks(lifecycles int, leftovers []Leftover) (leaked []Goroutine, taken []int) {
	taken = make([]int, len(leftovers))
	for _, g := range Goroutines() {
		if b[g.ID] {
			continue
		}
		allowed := false
		for i, l := range leftovers {
			if g.has(l.Func) && taken[i] < l.Once+l.PerLifecycle*lifecycles {
				taken[i]++
				allowed = true
				break
			}
		}
		if !allowed {
			leaked = append(leaked, g)
		}
	}
	return leaked, taken
}

// AwaitNoLeak waits up to timeout (60 s when 0) until every goroutine
// started since b has ended, but the leftovers named (each at most Once +
// PerLifecycle x lifecycles), and fails t with the stacks of the others
// when they do not end. It logs what each leftover took and how long the
// goroutines took to settle.
func (b LeakBaseline) AwaitNoLeak(t testing.TB, what string, lifecycles int, leftovers ...Leftover) {
	t.Helper()
	start := time.Now()
	var leaked []Goroutine
	var taken []int
	settled := Await(60*time.Second, func() bool {
		leaked, taken = b.leaks(lifecycles, leftovers)
		return len(leaked) == 0
	})
	for i, l := range leftovers {
		t.Logf("COUNTS leak %s: lifecycles=%d leftover %q stayed=%d (allowed %d: %s)", what, lifecycles, l.Func, taken[i],
			l.Once+l.PerLifecycle*lifecycles, l.Why)
	}
	if settled {
		t.Logf("COUNTS leak %s: lifecycles=%d leaked=0 settled_in=%s", what, lifecycles, time.Since(start).Round(10*time.Millisecond))
		return
	}
	kinds := map[string]int{}
	for _, g := range leaked {
		kinds[g.Top()+" <- "+g.Entry()]++
	}
	keys := make([]string, 0, len(kinds))
	for k := range kinds {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var sb strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&sb, "  %d x %s\n", kinds[k], k)
	}
	sort.Slice(leaked, func(i, j int) bool { return leaked[i].Top()+leaked[i].Entry() < leaked[j].Top()+leaked[j].Entry() })
	for i, g := range leaked {
		if i == 40 {
			fmt.Fprintf(&sb, "... %d more\n", len(leaked)-i)
			break
		}
		sb.WriteString(g.Stack + "\n\n")
	}
	t.Fatalf("testenv: %s: %d goroutines started during %d lifecycles outlived them (waited %s):\n%s", what, len(leaked),
		lifecycles, time.Since(start).Round(time.Second), sb.String())
}

// PoolLeftover allows one driver goroutine per connection db's pool holds
// open now: pooled connections outlive the lifecycle that opened them by
// design, up to the pool's limits, and are closed with the pool. On MariaDB
// that is go-sql-driver/mysql's watcher, one per connection. On PostgreSQL
// it is pgx's background reader: pgx starts it when a write is slow (its
// slowWriteTimer) and stops it once the write is done, but a stopped reader
// ends only after its Read returns, so an idle connection keeps it parked
// in that Read until the connection's next use or its close (seen in a
// fresh-clone run on a loaded 2-core VM).
func PoolLeftover(db *sqlx.DB) Leftover {
	if db.DriverName() != "mysql" {
		return Leftover{Func: "bgreader.(*BGReader).bgRead", Once: db.Stats().OpenConnections,
			Why: "the database pool keeps its idle connections; a connection whose write was slow keeps pgx's background reader parked in a read"}
	}
	return Leftover{Func: "mysqlConn).startWatcher", Once: db.Stats().OpenConnections,
		Why: "the database pool keeps its idle connections, one watcher goroutine each (mysql driver)"}
}

// The rocketmq-client-go goroutines that outlive a Shutdown on both the
// patched and the upstream build (LeftoverLateConnection: on the upstream
// build only). None of them runs rmqtx's code; each
// holds its client (and what that references) until it ends.
var (
	// LeftoverStatsSleepers: each push consumer creates five statistics
	// sets of six goroutines; Shutdown closes their channel, but three of
	// each sleep until the next minute, hour and month before they first
	// look at it.
	LeftoverStatsSleepers = Leftover{Func: "consumer.(*statsItemSet).init", PerLifecycle: 15,
		Why: "client: push consumer statistics goroutines sleep to the next minute/hour/month before they see Shutdown"}
	// LeftoverExpiredMsgSleeper: a push consumer's cleanExpiredMsg loop
	// sleeps ConsumeTimeout (15 min by default) before it first looks at
	// Shutdown.
	LeftoverExpiredMsgSleeper = Leftover{Func: "consumer.(*pushConsumer).Start.func1.2", PerLifecycle: 1,
		Why: "client: push consumer's cleanExpiredMsg goroutine sleeps ConsumeTimeout before it sees Shutdown"}
	// LeftoverLateConnection: the namesrvs' own remoting client (the
	// name server connection, and its reader goroutine) is never shut
	// down with the client; the connection ends only when it has been
	// idle for the client's ReadTimeout (120 s) or the name server drops
	// it. Patch 6 (third_party/rocketmq-client-go/PATCHES.md) shuts it
	// down, so on the patched client none may stay.
	LeftoverLateConnection = lateConnection(PatchedClient())
)

func lateConnection(patched bool) Leftover {
	if patched {
		return Leftover{Func: "remote.(*remotingClient).connect",
			Why: "patched client (patch 6): Shutdown closes the name server connection too, none may stay"}
	}
	return Leftover{Func: "remote.(*remotingClient).connect", PerLifecycle: 1,
		Why: "upstream client: the name server connection is never closed by Shutdown (ends after 120 s idle)"}
}

// PatchedClient reports whether this binary was built with the patched
// rocketmq-client-go of third_party/ (go.mod's replace) rather than the
// upstream module (scripts/upstream-mod.sh): where the client's code was
// compiled from. A -trimpath build names the upstream module
// "rocketmq-client-go/v2@<version>" too.
func PatchedClient() bool {
	fn := runtime.FuncForPC(reflect.ValueOf(rocketmq.NewPushConsumer).Pointer())
	if fn == nil {
		return false
	}
	file, _ := fn.FileLine(fn.Entry())
	return !strings.Contains(file, "rocketmq-client-go/v2@")
}
