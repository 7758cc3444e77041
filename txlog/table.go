package txlog

import "github.com/rmqtx/rmqtx/internal/sqlname"

// TableSuffix: the log lives in <prefix>txlog.
const TableSuffix = "txlog"

// TableName returns the log's table name under prefix, the name New uses
// (the prefix verbatim, as in New: pass DefaultPrefix for the standard
// name), or an error wrapping ErrInvalid for an invalid prefix.
func TableName(prefix string) (string, error) {
	name, err := sqlname.Table(prefix, TableSuffix)
	if err != nil {
		return "", invalid("%v", err)
	}
	return name, nil
}
