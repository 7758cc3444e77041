package startcheck_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/errclass"
	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/startcheck"
	"github.com/rmqtx/rmqtx/internal/testenv"
)

// TestDatabase: a healthy database passes; a closed port and a wrong
// password fail naming the address and the cause, never the password.
func TestDatabase(t *testing.T) {
	testenv.EachDB(t, func(t *testing.T, db *sqlx.DB) {
		ctx := context.Background()
		require.Equal(t, testenv.ServerAddr(t, db), dialect.ServerAddr(db.DB), "the address comes from the driver's config")
		require.NoError(t, startcheck.Database(ctx, db.DB))

		closed := testenv.ClosedAddr(t)
		err := startcheck.Database(ctx, testenv.PoolVia(t, db, closed).DB)
		require.ErrorIs(t, err, errclass.ErrDatabaseUnreachable)
		require.Contains(t, err.Error(), "database at "+closed+": connection refused")

		const secret = "not-the-password-h5"
		var bad *sqlx.DB
		if db.DriverName() == "mysql" {
			bad = testenv.MySQLVariant(t, db, func(c *mysql.Config) { c.Passwd = secret })
		} else {
			bad = testenv.PGVariant(t, db, func(c *pgx.ConnConfig) { c.Password = secret })
		}
		err = startcheck.Database(ctx, bad.DB)
		require.ErrorIs(t, err, errclass.ErrDatabaseUnreachable)
		require.Contains(t, err.Error(), testenv.ServerAddr(t, db)+": authentication failed")
		require.NotContains(t, err.Error(), secret)
		t.Logf("%s: %v", db.DriverName(), err)
	})
}

// TestNameServers: the real name server answers; a closed port is refused;
// the broker's port answers, but not as a name server; one good address of
// several is enough.
func TestNameServers(t *testing.T) {
	ctx := context.Background()
	s := testenv.Load()
	require.NoError(t, startcheck.NameServers(ctx, []string{s.NameServer}))

	closed := testenv.ClosedAddr(t)
	err := startcheck.NameServers(ctx, []string{closed})
	require.ErrorIs(t, err, errclass.ErrNameServerUnreachable)
	require.Contains(t, err.Error(), closed+": connection refused")

	err = startcheck.NameServers(ctx, []string{s.Broker})
	require.ErrorIs(t, err, errclass.ErrNameServerUnreachable)
	require.Contains(t, err.Error(), s.Broker+": not a name server")

	err = startcheck.NameServers(ctx, []string{s.MySQLAddr})
	require.ErrorIs(t, err, errclass.ErrNameServerUnreachable)
	require.Contains(t, err.Error(), s.MySQLAddr+": not a RocketMQ server")

	require.NoError(t, startcheck.NameServers(ctx, []string{closed, s.NameServer}))

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	err = startcheck.NameServers(cctx, []string{s.NameServer})
	require.ErrorIs(t, err, errclass.ErrNameServerUnreachable)
	require.True(t, errors.Is(err, context.Canceled) || strings.Contains(err.Error(), "canceled"), err)
}
