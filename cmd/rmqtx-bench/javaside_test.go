package main

import (
	"context"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/admin"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
)

// BenchTx's answers become rounds: its percentiles stand in for the
// latencies the Go loop would have sorted, its first error is kept, a
// failed command is an error, and a line that is not its JSON is refused.
func TestJavaReplyParsing(t *testing.T) {
	t.Parallel()
	r, err := parseJavaReply([]byte(`{"side":"java tx producer","count":4000,"errors":2,"seconds":2.0005,"p50_ms":1.25,"p99_ms":4.5,"p999_ms":1.7E1,"checks":3,"first_error":"send SEND_OK, local transaction ROLLBACK_MESSAGE"}`))
	require.NoError(t, err)
	require.Equal(t, "java tx producer", r.Side)
	require.EqualValues(t, 3, r.Checks)
	res := r.result()
	require.EqualValues(t, 4000, res.Count)
	require.EqualValues(t, 2, res.Errors)
	require.Equal(t, 2000500*time.Microsecond, res.Elapsed)
	require.ErrorContains(t, res.FirstErr, "ROLLBACK_MESSAGE")
	ro := res.Round(1)
	require.Equal(t, Round{Index: 1, Count: 4000, Errors: 2, Seconds: 2.0005, Rate: 4000 / 2.0005, P50Ms: 1.25, P99Ms: 4.5, P999Ms: 17}, ro)

	// A round with no committed send has no percentiles.
	r, err = parseJavaReply([]byte(`{"side":"s","count":0,"errors":5,"seconds":1,"p50_ms":0,"p99_ms":0,"p999_ms":0,"checks":0,"first_error":"x"}`))
	require.NoError(t, err)
	require.Nil(t, r.result().Measured)
	require.Zero(t, r.result().Round(1).P50Ms)

	r, err = parseJavaReply([]byte(`{"side":"s","ready":true}`))
	require.NoError(t, err)
	require.True(t, r.Ready)

	_, err = parseJavaReply([]byte(`{"error":"java.lang.IllegalArgumentException: no side x"}`))
	require.ErrorContains(t, err, "no side x")
	_, err = parseJavaReply([]byte(`12:00:01 INFO something the client printed`))
	require.Error(t, err)
	_, err = parseJavaReply([]byte(`{"side":"s","count":1,"latencies":[1]}`))
	require.Error(t, err, "an unknown field means the two programs disagree")

	u, err := withJDBCParams("jdbc:postgresql://127.0.0.1:5433/db?sslmode=disable", "prepareThreshold=1")
	require.NoError(t, err)
	require.Equal(t, "jdbc:postgresql://127.0.0.1:5433/db?sslmode=disable&prepareThreshold=1", u)
	u, err = withJDBCParams("jdbc:mariadb://127.0.0.1:3307/db", "useServerPrepStmts=true")
	require.NoError(t, err)
	require.Equal(t, "jdbc:mariadb://127.0.0.1:3307/db?useServerPrepStmts=true", u)
	_, err = withJDBCParams("jdbc:mariadb://127.0.0.1:3307/db", "password=secret")
	require.Error(t, err)
	require.NotContains(t, err.Error(), "secret")
}

// Both Java sides run a short round against the real broker and database:
// every send commits, and every committed send left exactly one business
// row (and, on the side with a log, one COMMITTED log row).
func TestJavaSidesRunRounds(t *testing.T) {
	testenv.Integration(t)
	testenv.EachDB(t, testJavaSidesRunRounds)
}

func testJavaSidesRunRounds(t *testing.T, db *sqlx.DB) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := javaTestEnv(t, db)
	sides, err := javaSides(ctx, e)
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, s := range sides {
			s.close()
		}
	})
	require.Len(t, sides, 2)
	require.Equal(t, sideJavaTx, sides[0].side.Name)
	require.Equal(t, sideJavaTxLog, sides[1].side.Name)
	for _, s := range sides {
		res := s.run(ctx, e.Opt.Concurrency, time.Second, 0, 0, false)
		require.NoError(t, res.FirstErr, s.side.Name)
		require.Zero(t, res.Errors, s.side.Name)
		require.Positive(t, res.Count, s.side.Name)
		require.Equal(t, res.Count, s.ok.Load(), s.side.Name)
		ro := res.Round(1)
		require.Positive(t, ro.P50Ms, s.side.Name)
		require.GreaterOrEqual(t, ro.P99Ms, ro.P50Ms, s.side.Name)
		require.GreaterOrEqual(t, ro.P999Ms, ro.P99Ms, s.side.Name)
		require.InDelta(t, 1.0, ro.Seconds, 0.5, s.side.Name)
		n, err := e.countRows(ctx, s.table)
		require.NoError(t, err)
		require.EqualValues(t, res.Count, n, "%s: business rows = committed sends", s.side.Name)
		t.Logf("%s: %d sends in %.2fs, p50 %.2fms p99 %.2fms", s.side.Name, ro.Count, ro.Seconds, ro.P50Ms, ro.P99Ms)
	}
	// The log side wrote one COMMITTED log row per business row.
	var names []string
	require.NoError(t, db.SelectContext(ctx, &names, db.Rebind("SELECT table_name FROM information_schema.tables WHERE table_name LIKE ?"), "bench_"+e.Names.Run()+"_jhandlog%"))
	require.Len(t, names, 1, "one hand-written log table")
	name := names[0]
	var committed int
	require.NoError(t, db.GetContext(ctx, &committed, "SELECT COUNT(*) FROM "+name+" WHERE state = 'COMMITTED'"))
	require.EqualValues(t, sides[1].ok.Load(), committed)

	// A second round of the same side goes on where the first ended.
	before := sides[0].ok.Load()
	res := sides[0].run(ctx, e.Opt.Concurrency, 0, 50, 0, false)
	require.NoError(t, res.FirstErr)
	require.EqualValues(t, 50, res.Count, "-n bounds the round")
	require.Equal(t, before+50, sides[0].ok.Load())
}

// javaTestEnv is an Env on the test's database (testenv's, on either
// engine), with the run's services and a small concurrency.
func javaTestEnv(t *testing.T, db *sqlx.DB) *Env {
	t.Helper()
	s := LoadServices()
	s.Engine = engineMySQL
	var dbName string
	q := "SELECT DATABASE()"
	if db.DriverName() == "pgx" {
		s.Engine, q = enginePostgres, "SELECT current_database()"
	}
	require.NoError(t, db.Get(&dbName, q))
	a, err := admin.NewAdmin(admin.WithResolver(s.Resolver()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	return &Env{
		S: s, DB: db, DBName: dbName, Names: NewNamer(), Log: t.Logf, admin: a,
		Opt: Options{Concurrency: 4, Payload: 256, Timeout: time.Minute},
	}
}
