package txproducer_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/txproducer"
)

// openLazy returns a pool that has not connected (sql.Open never dials).
func openLazy(t *testing.T, dbName string) *sqlx.DB {
	t.Helper()
	db, err := sqlx.Open("mysql", "u:p@tcp(127.0.0.1:1)/"+dbName)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// The txlog row is written in DB's transaction and checks read it through
// Log: a Log on another database would let a check miss a committed row
// (I3), so New rejects it and names the field.
func TestConfigLogMustUseDB(t *testing.T) {
	t.Parallel()
	shop, other := openLazy(t, "shop"), openLazy(t, "other")
	base := txproducer.Config{NameServers: []string{"127.0.0.1:9876"}, Group: "g"}
	logOn := func(db *sqlx.DB) *txlog.Store {
		s, err := txlog.New(db, txlog.DefaultPrefix)
		require.NoError(t, err)
		return s
	}

	c := base
	c.DB, c.Log = shop, logOn(other)
	_, err := txproducer.New(c)
	require.ErrorIs(t, err, txproducer.ErrConfig)
	require.Contains(t, err.Error(), "Log")
	require.Equal(t, txproducer.DontRetry, txproducer.RetryAdvice(err))

	for name, c := range map[string]txproducer.Config{
		"DB alone":            {DB: shop},
		"Log alone":           {Log: logOn(shop)},
		"Log built on DB":     {DB: shop, Log: logOn(shop)},
		"same pool, new sqlx": {DB: sqlx.NewDb(shop.DB, "mysql"), Log: logOn(shop)},
	} {
		c.NameServers, c.Group = base.NameServers, base.Group
		p, err := txproducer.New(c)
		require.NoError(t, err, name)
		require.Same(t, shop.DB, p.Log().DB().DB, name)
	}
}

// Only ErrCommitUnknown may be retried with the same event id; the
// failures that spent the id ask for a new one; the rest for nothing.
func TestRetryAdvice(t *testing.T) {
	t.Parallel()
	wrap := func(err error) error { return fmt.Errorf("outer: %w", err) }
	for _, tc := range []struct {
		err  error
		want txproducer.Advice
	}{
		{nil, txproducer.DontRetry},
		{wrap(txproducer.ErrCommitUnknown), txproducer.RetryWithSameID},
		{wrap(txproducer.ErrSend), txproducer.RetryWithNewID},
		{wrap(txproducer.ErrDatabase), txproducer.RetryWithNewID},
		{wrap(txproducer.ErrFenced), txproducer.RetryWithNewID},
		{fmt.Errorf("%w: %w", txproducer.ErrLocalTx, errors.New("declined")), txproducer.DontRetry},
		{wrap(txproducer.ErrEventIDConflict), txproducer.DontRetry},
		{wrap(txproducer.ErrInvalidMessage), txproducer.DontRetry},
		{wrap(txproducer.ErrPayloadTooLarge), txproducer.DontRetry},
		{txproducer.ErrConfig, txproducer.DontRetry},
		{&txproducer.BrokerSettingsError{}, txproducer.DontRetry},
		{txproducer.ErrNotStarted, txproducer.DontRetry},
		{txproducer.ErrClosed, txproducer.DontRetry},
		{errors.New("not ours"), txproducer.DontRetry},
	} {
		require.Equal(t, tc.want, txproducer.RetryAdvice(tc.err), "%v", tc.err)
		require.Equal(t, tc.want != txproducer.DontRetry, txproducer.IsRetryable(tc.err), "IsRetryable(%v)", tc.err)
	}
}
