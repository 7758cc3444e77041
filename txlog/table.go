package txlog

import (
	"fmt"

	"github.com/rmqtx/rmqtx/internal/sqlname"
)

// TableSuffix: the log lives in <prefix>txlog.
const TableSuffix = "txlog"

// TableName returns the log's table name under prefix, the name New uses
// ("" means DefaultPrefix: rmqtx_txlog), or an error wrapping ErrInvalid
// for an invalid prefix.
func TableName(prefix string) (string, error) {
	prefix, err := sqlname.Prefix(prefix)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return prefix + TableSuffix, nil
}
