package txlog

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
// DefaultPrefix, as in New). schema.Migrate runs them, with every other
// owner's, as one plan; schema.Files writes them for other tools.
func Migrations(d, prefix string) (fs.FS, map[string]string, error) {
	fsys, err := fs.Sub(migrationFS, "migrations/"+d)
	if err == nil {
		_, err = fs.Stat(fsys, ".")
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%w: no migrations for database %q", ErrInvalid, d)
	}
	table, err := TableName(prefix)
	if err != nil {
		return nil, nil, err
	}
	return fsys, map[string]string{"{{table}}": table}, nil
}
