package txlog

import "github.com/rmqtx/rmqtx/internal/sqlname"

// The table this package owns, for the packages that read it (inspect,
// archive, schema): its name and the columns they select or filter on. A
// column renamed here is renamed for all of them.
const (
	// TableSuffix: the log lives in <prefix>txlog.
	TableSuffix = "txlog"

	ColEventID          = "event_id"
	ColProducerGroup    = "producer_group"
	ColState            = "state"
	ColBusinessKey      = "business_key"
	ColCreatedAt        = "created_at"
	ColResolvedAt       = "resolved_at"
	ColRecoveryDecision = "recovery_decision"
)

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
