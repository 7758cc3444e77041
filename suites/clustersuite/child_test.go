//go:build failpoints

package clustersuite

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/inspect"
	"github.com/rmqtx/rmqtx/internal/failpoint"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/suites/internal/testbed"
	"github.com/rmqtx/rmqtx/txproducer"
	"github.com/rmqtx/rmqtx/wire"
)

// Environment of a child process.
const (
	envDB     = "RMQTX_CLUSTERSUITE_DB"
	envTopic  = "RMQTX_CLUSTERSUITE_TOPIC"
	envPGroup = "RMQTX_CLUSTERSUITE_PGROUP"
	envWant   = "RMQTX_CLUSTERSUITE_WANT_BROKER"

	childWatchdog = 90 * time.Second
	childTries    = 24
)

// TestHelperProcess is not a test: crashOnBroker re-executes the test
// binary to run it as a producer instance of a scenario's group that sends
// until a half message lands on the wanted broker, and is then killed by the
// armed failpoint (after the local commit, or inside the local
// transaction), leaving that half for the broker to check. A half on the
// other broker is rolled back (its Send's context is cancelled before the
// local transaction). Reaching the end is a failure.
func TestHelperProcess(t *testing.T) {
	if !testenv.IsChild(t) {
		return
	}
	s := testenv.Load()
	db := testenv.OpenDBRefEnv(t, envDB) // "mysql/<name>" or "postgres/<name>"
	topic, want := os.Getenv(envTopic), os.Getenv(envWant)
	look := inspect.RemotingLookup{Brokers: []string{os.Getenv("RMQTX_BROKER"), os.Getenv("RMQTX_BROKER_B")}, Timeout: 2 * time.Second}
	var mu sync.Mutex
	cancels := map[string]context.CancelFunc{}
	cfg := txproducer.Config{NameServers: []string{s.NameServer}, Group: os.Getenv(envPGroup), DB: db,
		FenceAge: testbed.FenceAge, WarmupTopics: []string{topic}, DisableRecovery: true,
		Test: txproducer.TestHooks{BeforeLocalTx: func(_ context.Context, id string) {
			// The half is stored: find the broker whose index has it.
			where := ""
			for deadline := time.Now().Add(10 * time.Second); where == "" && time.Now().Before(deadline); {
				ms, _ := look.QueryByKey(context.Background(), inspect.HalfTopic, id, 4)
				if len(ms) > 0 {
					where = ms[0].Broker
				} else {
					time.Sleep(50 * time.Millisecond)
				}
			}
			fmt.Printf("HALF %s %s\n", id, where)
			if where != want {
				mu.Lock()
				cancels[id]()
				mu.Unlock()
			}
		}},
	}
	p, err := txproducer.New(cfg)
	require.NoError(t, err)
	require.NoError(t, p.Start(context.Background()))
	for i := 0; i < childTries; i++ {
		id := wire.NewEventID()
		fmt.Printf("ATTEMPT %s\n", id)
		ctx, cancel := context.WithCancel(context.Background())
		mu.Lock()
		cancels[id] = cancel
		mu.Unlock()
		_, err := p.Send(ctx, testbed.Message("clustersuite", topic, id), testbed.InsertOrder(id, "crash", false))
		cancel()
		fmt.Printf("RESULT %s %v\n", id, err)
	}
	t.Fatalf("no half landed on %s in %d tries, or failpoint %s never fired", want, childTries, os.Getenv(failpoint.EnvVar))
}

// crashOnBroker runs one child producer of b's group that leaves a half on
// the broker at want, killed at failpoint fp. It records every attempt of
// the child and returns the id of the half it left.
func (b *bed) crashOnBroker(fp, want string) (string, error) {
	out, err := testenv.Child{Test: "TestHelperProcess", Failpoint: fp, Timeout: childWatchdog + 30*time.Second, Env: []string{
		envDB + "=" + b.DBRef, envTopic + "=" + b.Topic, envPGroup + "=" + b.PGroup, envWant + "=" + want,
	}}.Crash(context.Background())
	if err != nil {
		return "", fmt.Errorf("child on %s: %w", want, err)
	}
	var ids []string
	finished := map[string]bool{}
	halfAt := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 2 && f[0] == "ATTEMPT":
			ids = append(ids, f[1])
		case len(f) >= 2 && f[0] == "RESULT":
			finished[f[1]] = true
		case len(f) >= 3 && f[0] == "HALF":
			halfAt[f[1]] = f[2]
		}
	}
	left := ""
	for _, id := range ids {
		if finished[id] {
			// Rolled back in the child: its half was on the other broker.
			b.Record(&testbed.Attempt{ID: id, Source: "child", Broker: halfAt[id], Answered: true, Err: errors.New("rolled back in the child"),
				State: txproducer.StateRolledBack})
			continue
		}
		left = id
		b.Record(&testbed.Attempt{ID: id, Source: "crash:" + fp, Broker: halfAt[id]})
	}
	if left == "" || halfAt[left] != want {
		return "", fmt.Errorf("child %s on %s: no half left there (last %q at %q)\n%s", fp, want, left, halfAt[left], out)
	}
	return left, nil
}

// crashJob is one child to run.
type crashJob struct{ fp, broker string }

// crashAll runs the jobs' children concurrently and returns the ids of the
// halves they left, in the jobs' order.
func (b *bed) crashAll(t *testing.T, jobs []crashJob) []string {
	t.Helper()
	ids := make([]string, len(jobs))
	errs := make([]error, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids[i], errs[i] = b.crashOnBroker(j.fp, j.broker)
		}()
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	return ids
}
