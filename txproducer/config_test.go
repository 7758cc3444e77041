package txproducer_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
)

// The txlog row is written in DB's transaction and checks read it through
// Log: a Log on another database would let a check miss a committed row
// (I3), so New rejects it and names the field. Both handles are real pools,
// connected and pinged, on two databases of the same MariaDB.
//
// "The same database" is decided by the pool, not by a name: New compares
// the *sql.DB under DB and Log. A second pool that reaches the same schema
// is refused too. That is deliberate: New does no I/O, and nothing a pool
// exposes without a query tells the same server and schema from a replica,
// a read/write-splitting proxy or another server with the same schema name
// (where a check would miss a committed row). Passing DB alone, or a Log
// built on DB, always works, so the strict rule costs nothing. On both
// databases: the pools are the drivers'.
func TestConfigLogMustUseDB(t *testing.T) {
	t.Parallel()
	s := testenv.Integration(t)
	testenv.EachDB(t, func(t *testing.T, shop *sqlx.DB) {
		t.Parallel()
		other := testenv.MySQLDB(t) // a second database on shop's server
		if shop.DriverName() != "mysql" {
			other = testenv.PostgresDB(t)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, shop.PingContext(ctx))
		require.NoError(t, other.PingContext(ctx))
		require.NotEqual(t, testenv.DBName(t, shop), testenv.DBName(t, other), "two databases")
		// A second pool on shop's own database.
		shopAgain := testenv.Reopen(t, shop)
		require.NoError(t, shopAgain.PingContext(ctx))
		require.Equal(t, testenv.DBName(t, shop), testenv.DBName(t, shopAgain))

		base := txproducer.Config{NameServers: []string{s.NameServer}, Group: "g"}
		logOn := func(db *sqlx.DB) *txlog.Store {
			s, err := txlog.New(db, txlog.DefaultPrefix)
			require.NoError(t, err)
			return s
		}
		for name, log := range map[string]*txlog.Store{
			"Log on another database":                logOn(other),
			"Log on the same database, another pool": logOn(shopAgain),
		} {
			c := base
			c.DB, c.Log = shop, log
			_, err := txproducer.New(c)
			require.ErrorIs(t, err, txproducer.ErrConfig, name)
			require.Contains(t, err.Error(), "Log:", name)
			require.Equal(t, txproducer.DontRetry, txproducer.RetryAdvice(err), name)
		}

		for name, c := range map[string]txproducer.Config{
			"DB alone":            {DB: shop},
			"Log alone":           {Log: logOn(shop)},
			"Log built on DB":     {DB: shop, Log: logOn(shop)},
			"same pool, new sqlx": {DB: sqlx.NewDb(shop.DB, shop.DriverName()), Log: logOn(shop)},
		} {
			c.NameServers, c.Group = base.NameServers, base.Group
			p, err := txproducer.New(c)
			require.NoError(t, err, name)
			require.Same(t, shop.DB, p.Log().DB().DB, name)
		}
	})
}

// A failed Send does not spend its id: every failure that committed
// nothing is retried with the same event id, as is an unknown outcome; the
// rest are not retried. IsRetryable says whether a retry may succeed
// unchanged: not after the caller's own refusal.
func TestRetryAdvice(t *testing.T) {
	t.Parallel()
	wrap := func(err error) error { return fmt.Errorf("outer: %w", err) }
	for _, tc := range []struct {
		err  error
		want txproducer.Advice
		// retryable is IsRetryable's answer when it differs from
		// want != DontRetry (only a business refusal in ErrLocalTx).
		refusal bool
	}{
		{nil, txproducer.DontRetry, false},
		{wrap(txproducer.ErrCommitUnknown), txproducer.RetryWithSameID, false},
		{wrap(txproducer.ErrSend), txproducer.RetryWithSameID, false},
		{wrap(txproducer.ErrDatabase), txproducer.RetryWithSameID, false},
		{wrap(txproducer.ErrFenced), txproducer.RetryWithSameID, false},
		{fmt.Errorf("%w: %w", txproducer.ErrLocalTx, errors.New("declined")), txproducer.RetryWithSameID, true},
		// the database rolled the caller's transaction back: run it again
		{fmt.Errorf("%w: %w", txproducer.ErrLocalTx, &mysql.MySQLError{Number: 1213, Message: "Deadlock found"}), txproducer.RetryWithSameID, false},
		{fmt.Errorf("%w: %w", txproducer.ErrLocalTx, &pgconn.PgError{Code: "40001", Message: "could not serialize access"}), txproducer.RetryWithSameID, false},
		{fmt.Errorf("%w: %w", txproducer.ErrLocalTx, &pgconn.PgError{Code: "40P01", Message: "deadlock detected"}), txproducer.RetryWithSameID, false},
		{fmt.Errorf("%w: %w", txproducer.ErrLocalTx, &pgconn.PgError{Code: "23505", Message: "duplicate key"}), txproducer.RetryWithSameID, true},
		{wrap(txproducer.ErrEventIDConflict), txproducer.DontRetry, false},
		{wrap(txproducer.ErrInvalidMessage), txproducer.DontRetry, false},
		{wrap(txproducer.ErrPayloadTooLarge), txproducer.DontRetry, false},
		{txproducer.ErrConfig, txproducer.DontRetry, false},
		{&txproducer.BrokerSettingsError{}, txproducer.DontRetry, false},
		{txproducer.ErrNotStarted, txproducer.DontRetry, false},
		{txproducer.ErrClosed, txproducer.DontRetry, false},
		{errors.New("not ours"), txproducer.DontRetry, false},
	} {
		require.Equal(t, tc.want, txproducer.RetryAdvice(tc.err), "%v", tc.err)
		require.Equal(t, tc.want != txproducer.DontRetry && !tc.refusal, txproducer.IsRetryable(tc.err), "IsRetryable(%v)", tc.err)
	}
}
