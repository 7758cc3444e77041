package main

import (
	"context"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/checkback"
	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/inspect"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/schema"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/wire"
)

func TestScaleParseRows(t *testing.T) {
	for in, want := range map[string][]int64{
		"0,1000000":          {0, 1_000_000},
		"0,1000000,10000000": {0, 1_000_000, 10_000_000},
		"10M, 0 ,1M":         {0, 1_000_000, 10_000_000},
		"20k,0,20000":        {0, 20_000},
		"0":                  {0},
	} {
		got, err := parseScaleRows(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", ",", "x", "-1", "1G", "1.5M", "9999999999999999M"} {
		_, err := parseScaleRows(bad)
		require.Error(t, err, bad)
	}
}

func TestScaleParseChoice(t *testing.T) {
	for in, want := range map[string][]string{
		"both": {engineMySQL, enginePostgres}, "mysql": {engineMySQL}, "MariaDB": {engineMySQL},
		"postgres": {enginePostgres}, "pg": {enginePostgres},
	} {
		got, err := parseScaleChoice("-scale-db", in, engineMySQL, enginePostgres)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	_, err := parseScaleChoice("-scale-db", "oracle", engineMySQL, enginePostgres)
	require.ErrorContains(t, err, "-scale-db")
	got, err := parseScaleChoice("-scale-ids", "hashed", idsTime, idsHashed)
	require.NoError(t, err)
	require.Equal(t, []string{idsHashed}, got)
}

func TestScaleFlags(t *testing.T) {
	parse := func(args ...string) (scalePlan, error) {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var f scaleFlags
		registerScaleFlags(fs, &f)
		require.NoError(t, fs.Parse(args))
		return f.plan()
	}
	p, err := parse()
	require.NoError(t, err)
	require.Equal(t, scalePlan{Rows: []int64{0, 1_000_000}, DBs: []string{engineMySQL, enginePostgres}, IDs: []string{idsTime, idsHashed}}, p)

	p, err = parse("-scale-rows", "0,20k", "-scale-db", "postgres", "-scale-ids", "time", "-scale-archive")
	require.NoError(t, err)
	require.Equal(t, scalePlan{Rows: []int64{0, 20_000}, DBs: []string{enginePostgres}, IDs: []string{idsTime}, Archive: true}, p)

	_, err = parse("-scale-ids", "random")
	require.ErrorContains(t, err, "-scale-ids")

	// The command refuses a bad value before connecting to anything.
	var stderr strings.Builder
	require.Equal(t, 2, run([]string{"-workloads", "scale", "-scale-rows", "lots"}, io.Discard, &stderr))
	require.Contains(t, stderr.String(), "-scale-rows")
	require.True(t, scaleRequested([]string{"producer", "scale"}))
	require.NotContains(t, allWorkloads, "scale", "scale must not run by default")
}

func TestScaleFormatRows(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 20_000: "20k", 1_000_000: "1M", 10_000_000: "10M", 1_500_000: "1500k", 1_234_567: "1234567"} {
		require.Equal(t, want, fmtRows(n))
	}
	require.Equal(t, "mysql/hashed/10M", scaleLabel(engineMySQL, idsHashed, 10_000_000))
}

func TestScaleChunks(t *testing.T) {
	require.Empty(t, chunks(0, 1_000_000))
	require.Equal(t, [][2]int64{{1, 5}}, chunks(5, 1_000_000))
	require.Equal(t, [][2]int64{{1, 1_000_000}, {1_000_001, 2_000_000}, {2_000_001, 2_500_000}}, chunks(2_500_000, 1_000_000))
}

// TestScaleShape: the preload's rows as the measurements compute them: ids
// of the requested layout, timestamps over four weeks, oldest first, 2 %
// fences, a 0.1 % unfinished tail.
func TestScaleShape(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 123456789, time.UTC)
	const rows = 10_000
	ts := newPreloadShape(rows, idsTime, "abc1", 512, now, "g", "cg", "t")
	require.Equal(t, now.Add(-scaleSpan).Truncate(time.Millisecond), ts.Base)
	require.Equal(t, int64(rows-rows/1000+1), ts.TailFrom)
	require.False(t, ts.applied(ts.TailFrom))
	require.True(t, ts.applied(ts.TailFrom-1))
	require.WithinDuration(t, now, ts.createdAt(rows), time.Millisecond)

	prev := ""
	for seq := int64(1); seq <= rows; seq += 97 {
		id := ts.eventID(seq)
		u, err := uuid.Parse(id)
		require.NoError(t, err, id)
		require.Equal(t, uuid.Version(7), u.Version(), id)
		require.Equal(t, uuid.RFC4122, u.Variant(), id)
		sec, nsec := u.Time().UnixTime()
		require.Equal(t, ts.createdAt(seq).UnixMilli(), time.Unix(sec, nsec).UnixMilli(), "the id carries its row's time")
		require.Greater(t, id, prev, "time-ordered ids sort by seq")
		prev = id
		p := ts.payload(seq)
		require.Len(t, p, 512)
		require.Equal(t, wire.Hash(p), ts.payloadHash(seq))
	}
	rolled := 0
	for seq := int64(1); seq <= rows; seq++ {
		if !ts.committed(seq) {
			rolled++
		}
	}
	require.Equal(t, rows/scaleRolledEvery, rolled)

	hs := newPreloadShape(rows, idsHashed, "abc1", 8, now, "g", "cg", "t")
	require.Len(t, hs.payload(1), 12, "payload is at least the seq's 12 digits")
	seen := map[string]bool{}
	inversions := 0
	prev = ""
	for seq := int64(1); seq <= 1000; seq++ {
		id := hs.eventID(seq)
		u, err := uuid.Parse(id)
		require.NoError(t, err, id)
		require.Equal(t, uuid.Version(5), u.Version(), id)
		require.False(t, seen[id], id)
		seen[id] = true
		if id < prev {
			inversions++
		}
		prev = id
	}
	require.Greater(t, inversions, 300, "hashed ids are spread, not ordered")
	require.Equal(t, newPreloadShape(rows, idsHashed, "abc1", 8, now, "g", "cg", "t").eventID(42), hs.eventID(42), "ids are a pure function of the shape")
}

// TestScalePreloadSQL: one statement per table and chunk, from the
// database's own set generator, and the attempts only in the tail's chunk.
func TestScalePreloadSQL(t *testing.T) {
	now := time.Now()
	tb := preloadTables{Txlog: "p_txlog", Outbox: "p_outbox", ConsumeLog: "p_consume_log", Attempt: "p_consume_attempt"}
	p := newPreloadShape(2_000_000, idsHashed, "s'1", 512, now, "g", "cg", "topic")
	my := p.preloadSQL(engineMySQL, tb, 1, 1_000_000)
	require.Len(t, my, 3, "no tail in the first chunk")
	for _, q := range my {
		require.Contains(t, q, "FROM seq_1_to_1000000")
		require.NotContains(t, q, "%!", "format verbs")
		require.Contains(t, q, "'s''1/'", "quoted salt")
	}
	pg := p.preloadSQL(enginePostgres, tb, 1_000_001, 2_000_000)
	require.Len(t, pg, 4, "the tail's chunk also fills the attempts")
	for i, table := range []string{tb.Txlog, tb.Outbox, tb.ConsumeLog, tb.Attempt} {
		require.True(t, strings.HasPrefix(pg[i], "INSERT INTO "+table+" ("), pg[i][:40])
		require.Contains(t, pg[i], "generate_series(CAST(1000001 AS BIGINT), CAST(2000000 AS BIGINT))")
	}
}

// TestScalePreloadMatchesShape: what the databases' set generators write is
// what preloadShape computes (ids, payloads, hashes, times, states), and
// rmqtx reads the rows as its own: the check-back answers COMMIT from an
// old row, a redelivery of an old event is a duplicate, stuck lists the
// unfinished tail.
func TestScalePreloadMatchesShape(t *testing.T) {
	testenv.Integration(t)
	testenv.EachDB(t, testScalePreloadMatchesShape)
}

func testScalePreloadMatchesShape(t *testing.T, db *sqlx.DB) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	engine := engineMySQL
	if db.DriverName() == "pgx" {
		engine = enginePostgres
	}
	const rows = 3000
	for _, ids := range []string{idsTime, idsHashed} {
		t.Run(ids, func(t *testing.T) {
			prefix := "sc" + testenv.RandSuffix(6) + "_"
			require.NoError(t, schema.MigrateAll(ctx, db, prefix))
			store, err := txlog.New(db, prefix)
			require.NoError(t, err)
			ob, err := outbox.NewTable(prefix)
			require.NoError(t, err)
			ct, err := consumer.Tables(prefix)
			require.NoError(t, err)
			tb := preloadTables{Txlog: store.Table(), Outbox: ob.Name(), ConsumeLog: ct.ConsumeLog, Attempt: ct.Attempt}
			shape := newPreloadShape(rows, ids, testenv.RandSuffix(4), 300, time.Now(), "pg1", "cg1", "topic1")
			res, err := preload(ctx, db, engine, tb, shape, 1000, t.Logf)
			require.NoError(t, err)
			tail := rows - shape.TailFrom + 1
			require.Equal(t, int64(3*rows), res.Rows, "txlog, outbox, consume log + attempts")

			count := func(table, where string) int {
				var n int
				require.NoError(t, db.GetContext(ctx, &n, "SELECT COUNT(*) FROM "+table+" WHERE "+where))
				return n
			}
			require.Equal(t, rows/scaleRolledEvery, count(tb.Txlog, "state = 'ROLLED_BACK'"))
			require.Equal(t, int(rows-tail), count(tb.Outbox, "status = 'SENT'"))
			require.Equal(t, int(tail), count(tb.Outbox, "status = 'RETRY'"))
			require.Equal(t, int(rows-tail), count(tb.ConsumeLog, "status = 'SUCCESS'"))
			require.Equal(t, int(tail), count(tb.Attempt, "1 = 1"))

			for _, seq := range []int64{1, 2, scaleRolledEvery, 999, 1000, 1001, rows / 2, rows} {
				id := shape.eventID(seq)
				row, err := store.Get(ctx, id)
				require.NoError(t, err, "seq %d id %s", seq, id)
				require.WithinDuration(t, shape.createdAt(seq), row.CreatedAt, time.Microsecond, "seq %d", seq)
				require.NotEmpty(t, row.Half(), "the row names its half")
				if !shape.committed(seq) {
					require.Equal(t, txlog.StateRolledBack, row.State, "seq %d", seq)
					require.Nil(t, row.Payload)
					continue
				}
				require.Equal(t, txlog.StateCommitted, row.State, "seq %d", seq)
				require.Equal(t, shape.payload(seq), row.Payload, "seq %d", seq)
				require.Equal(t, shape.payloadHash(seq), row.PayloadHash, "seq %d", seq)
				require.Equal(t, shape.businessKey(seq), row.BusinessKey)
				if shape.applied(seq) {
					cl, err := ct.ConsumeLogByEvent(ctx, db, id)
					require.NoError(t, err)
					require.Len(t, cl, 1)
					require.Equal(t, shape.payloadHash(seq), cl[0].RequestHash)
				}
			}

			// rmqtx reads them as its own rows.
			chk, err := checkback.New(checkback.Config{Log: store, Group: shape.Group})
			require.NoError(t, err)
			a := chk.CheckQuery(ctx, checkback.Query{EventID: shape.eventID(7), Group: shape.Group, PayloadHash: shape.payloadHash(7)})
			require.Equal(t, checkback.Commit, a.Decision, "%s %v", a.Reason, a.Err)
			require.Equal(t, checkback.ReasonFound, a.Reason)

			proc, err := consumer.NewProcessor(consumer.ProcessorConfig{Group: shape.CGroup, DB: db, TablePrefix: prefix, VersionMode: consumer.VersionNone, DedupCacheSize: -1,
				Routes: map[string]consumer.Route{benchEventType: {Handler: func(context.Context, *sqlx.Tx, consumer.Event) error { return nil }}}})
			require.NoError(t, err)
			out := proc.Process(ctx, consumerMessage(shape.eventID(11), shape.payload(11)))
			require.Equal(t, consumer.ResultDuplicate, out.Result, "%v", out.Err)

			in, err := inspect.New(inspect.Config{DB: db, TablePrefix: prefix})
			require.NoError(t, err)
			stuck, _, err := in.Stuck(ctx, time.Minute, 100)
			require.NoError(t, err)
			want := 0
			for seq := shape.TailFrom; seq <= rows; seq++ {
				if shape.createdAt(seq).Before(time.Now().Add(-time.Minute)) {
					want += 2 // its outbox RETRY row and its attempt
				}
			}
			require.NotZero(t, want)
			require.Len(t, stuck, want, "the outbox RETRY rows and the attempts older than a minute")
			v, err := in.Event(ctx, shape.eventID(rows))
			require.NoError(t, err)
			require.True(t, v.Found())
		})
	}
}
