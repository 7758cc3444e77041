package outbox

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/testenv"
)

// TestHeldSentUsesPrimaryKeyOnPostgres plans the held claim's SENT update as
// the dispatcher runs it (a prepared statement, generic plan) on a
// PostgreSQL outbox of 10 000 PENDING rows of 512-byte payloads (the
// bench's) that was never analyzed, as a new
// or bulk-loaded outbox is. With a status condition beside the ids,
// PostgreSQL chose the dispatch index and checked every due row against the
// whole id list (54 ms for 64 rows of 10 000, and the bound of the held
// dispatcher on PostgreSQL: BENCHMARKS.md); by primary key it is 0.9 ms.
func TestHeldSentUsesPrimaryKeyOnPostgres(t *testing.T) {
	t.Parallel()
	db := testenv.PostgresDB(t)
	b := newBed(t, db)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	table := b.table.name
	_, err := db.ExecContext(ctx, `INSERT INTO `+table+` (event_id, event_type, destination, payload, status, next_retry_at, created_at, updated_at)
SELECT 'plan-' || lpad(g::text, 6, '0'), 'T', 'd', convert_to(repeat('x', 512), 'UTF8'), 'PENDING', now(), now(), now() FROM generate_series(1, 10000) g`)
	require.NoError(t, err)

	d, err := dialect.For(db)
	require.NoError(t, err)
	q := newQueries(d, table)
	ids := make([]string, 64)
	lits := make([]string, 0, 65)
	lits = append(lits, "'token'")
	for i := range ids {
		ids[i] = fmt.Sprintf("plan-%06d", 100+i*70)
		lits = append(lits, "'"+ids[i]+"'")
	}
	query, args, err := q.inList(q.heldSent, []any{"token"}, ids)
	require.NoError(t, err)
	require.Len(t, args, len(lits))

	conn, err := db.Connx(ctx)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	_, err = conn.ExecContext(ctx, "SET plan_cache_mode = force_generic_plan")
	require.NoError(t, err)
	_, err = conn.ExecContext(ctx, "PREPARE held_sent AS "+query)
	require.NoError(t, err)
	var lines []string
	require.NoError(t, conn.SelectContext(ctx, &lines, "EXPLAIN (COSTS OFF) EXECUTE held_sent("+strings.Join(lits, ", ")+")"))
	plan := strings.Join(lines, "\n")
	t.Logf("plan of the held SENT update (generic, no statistics):\n%s", plan)
	require.Contains(t, plan, table+"_pkey", "the held SENT update finds its rows by primary key")
	require.NotContains(t, plan, "_dispatch", "the held SENT update does not scan the due rows")
}
