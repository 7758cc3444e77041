// Package txlog is rmqtx's transaction log: one row per decided
// transactional event, keyed by the event id, in the producer's own
// database. It is the only thing the check-back answers from (invariant I3).
//
// The producer inserts a COMMITTED row as the FIRST statement of the local
// transaction, so the row appears exactly when the business data commits,
// and an in-flight local transaction holds the row's primary-key lock for
// its whole life. A check-back that finds no row once the fence age has
// passed writes a ROLLED_BACK row (Store.Fence, an insert that ignores a duplicate key): it
// waits on that lock if the local transaction is still running, and the
// final answer is whatever the row says afterwards. A local transaction
// that starts after a fence fails on the duplicate key and rolls back. So
// there is never a row in an "in progress" state: a missing row means "still
// running or never ran", and a present row is final.
//
// Get is one autocommit point read that also returns the session's
// isolation level; at READ UNCOMMITTED (where a plain SELECT would see an
// in-flight transaction's row) it reads again in a read-only READ COMMITTED
// transaction, so "missing" holds whatever the server's or the session's
// default isolation. Every statement is prepared once per pooled connection
// (internal/stmtcache), the insert on the caller's transaction included, so
// each costs one round trip whatever the DSN.
//
// The Store keeps all SQL behind one type, written through the database
// seam (internal/dialect: MySQL 8 and MariaDB 10.11 today), so
// the producer, check-back, recovery and the runbook tooling share it. The
// table name carries a validated prefix (DefaultPrefix unless configured);
// values are always bound. schema.MigrateAll creates the schema.
package txlog
