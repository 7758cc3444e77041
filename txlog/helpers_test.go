package txlog_test

import (
	"github.com/jmoiron/sqlx"
)

// nilDB is a handle that is never used for I/O (validation-only tests).
func nilDB() *sqlx.DB { return sqlx.NewDb(nil, "mysql") }

// blockedInserts counts the statements of db's database that wait on a
// lock while inserting (a fence's insert that meets a local transaction's
// row), from the server's own list of sessions.
func blockedInserts(db *sqlx.DB) int {
	q := "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND INFO LIKE 'INSERT IGNORE INTO%'"
	if db.DriverName() != "mysql" {
		q = "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'" +
			" AND query LIKE 'INSERT INTO%ON CONFLICT%'"
	}
	var n int
	_ = db.Get(&n, q)
	return n
}
