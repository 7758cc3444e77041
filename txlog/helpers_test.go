package txlog_test

import (
	"github.com/jmoiron/sqlx"
)

// nilDB is a handle that is never used for I/O (validation-only tests).
func nilDB() *sqlx.DB { return sqlx.NewDb(nil, "mysql") }
