package outbox

import (
	"embed"
	"fmt"
	"io/fs"
)

//go:embed migrations
var migrationFS embed.FS

// Migrations returns the package's schema steps for the dialect named d
// ("mysql"): the NNN_description.sql files of one folder, and the validated
// table names that fill their {{...}} placeholders under prefix ("" means
// the default prefix). schema.MigrateAll runs them, with every other
// owner's, as one plan. A database migrated before that plan recorded these
// steps in <prefix>outbox_schema.
func Migrations(d string, prefix string) (fs.FS, map[string]string, error) {
	fsys, err := fs.Sub(migrationFS, "migrations/"+d)
	if err == nil {
		_, err = fs.Stat(fsys, ".")
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%w: no migrations for database %q", ErrConfig, d)
	}
	t, err := NewTable(prefix)
	if err != nil {
		return nil, nil, err
	}
	return fsys, map[string]string{"{{table}}": t.name}, nil
}
