package testenv

import (
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/jmoiron/sqlx"
)

// ReadUncommittedDB opens a second pool on db's database whose sessions
// default to READ UNCOMMITTED (a DSN session parameter; the server's GLOBAL
// setting, shared with other tests, is never touched). It fails the test
// unless the sessions really run at that level. MariaDB before 11.1 names
// the variable tx_isolation, MySQL 8 transaction_isolation. On PostgreSQL
// the sessions default to READ UNCOMMITTED too, which PostgreSQL runs as
// READ COMMITTED: it never reads uncommitted rows.
func ReadUncommittedDB(t testing.TB, db *sqlx.DB) *sqlx.DB {
	t.Helper()
	if db.DriverName() != "mysql" {
		return pgReadUncommittedDB(t, db)
	}
	for _, v := range []string{"tx_isolation", "transaction_isolation"} {
		ru := openVariant(t, db, func(c *mysql.Config) {
			if c.Params == nil {
				c.Params = map[string]string{}
			}
			c.Params[v] = "'READ-UNCOMMITTED'"
		})
		var level string
		if err := ru.Get(&level, "SELECT @@"+v); err != nil {
			continue
		}
		if level != "READ-UNCOMMITTED" {
			t.Fatalf("testenv: session isolation is %s, want READ-UNCOMMITTED", level)
		}
		return ru
	}
	t.Fatalf("testenv: could not open a READ UNCOMMITTED session")
	return nil
}
