package dialect

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestQualifySet(t *testing.T) {
	cols := "consumer_group, event_id, status, park_count, at, retry_count"
	for _, c := range []struct{ set, want string }{
		{"retry_count = retry_count + 1", "retry_count = t.retry_count + 1"},
		{"at = EXCLUDED.at, status = 'at, status'", "at = EXCLUDED.at, status = 'at, status'"},
		{"park_count = park_count + 1, status = CASE WHEN status = 'it''s' THEN status ELSE 'P' END",
			"park_count = t.park_count + 1, status = CASE WHEN t.status = 'it''s' THEN t.status ELSE 'P' END"},
		// Function names, names not among the columns and the targets of
		// later assignments stay as they are.
		{"updated_at = timezone('UTC', statement_timestamp()), retry_count = COALESCE(retry_count, 0)",
			"updated_at = timezone('UTC', statement_timestamp()), retry_count = COALESCE(t.retry_count, 0)"},
		{"status = ?", "status = ?"},
	} {
		require.Equal(t, c.want, qualifySet("t", cols, c.set), c.set)
	}
}

func TestPostgresStatementShapes(t *testing.T) {
	d := Postgres
	require.Equal(t, "SELECT $1, $2", d.Rebind("SELECT ?, ?"))
	require.Equal(t, "INSERT INTO t (a, b) VALUES ($1, $2) ON CONFLICT (a) DO NOTHING",
		d.Rebind(d.InsertIgnore("t", "a, b", "?, ?", "a")))
	require.Equal(t, "INSERT INTO t (a, b) VALUES ($1, $2) ON CONFLICT (a) DO UPDATE SET b = t.b + EXCLUDED.b RETURNING (xmax = 0), b",
		d.Rebind(d.UpsertReturning("t", "a, b", "?, ?", "a", "b = b + "+d.Excluded("b"), "b")))
	require.Equal(t, "DELETE FROM t WHERE (a, b) IN (SELECT a, b FROM t WHERE s = $1 ORDER BY c LIMIT $2)",
		d.Rebind(d.DeleteLimit("t", "s = ?", "c", "a, b")))
	for _, name := range []string{"pgx", "pgx/v5"} {
		got, err := ForDriver(name)
		require.NoError(t, err)
		require.Equal(t, "postgres", got.Name())
	}
	_, err := ForDriver("postgres") // lib/pq: not tested, so refused
	require.ErrorIs(t, err, ErrUnsupported)
}
