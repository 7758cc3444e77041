package txlog

import (
	"errors"
	"fmt"
	"time"

	"github.com/rmqtx/rmqtx/internal/sqlname"
)

// DefaultPrefix is the table prefix used by rmqtx unless configured: the
// log lives in table rmqtx_txlog. It is the one rmqtx default
// (internal/sqlname), shared by every package.
const DefaultPrefix = sqlname.DefaultPrefix

// MinRetention is the shortest retention DeleteTerminalBefore accepts. A
// COMMITTED row must outlive every check and the discard recovery of its
// half message (broker transactionTimeOut + transactionCheckMax x
// transactionCheckInterval, 8 to 16 minutes with the broker defaults):
// deleting it earlier would let a late check fence a committed event.
const MinRetention = 24 * time.Hour

// State is the decided state of a transaction. There is no pending state:
// a transaction without a row is in flight or never ran.
type State string

// States.
const (
	StateCommitted  State = "COMMITTED"
	StateRolledBack State = "ROLLED_BACK"
)

// Valid reports whether s is one of the defined states.
func (s State) Valid() bool { return s == StateCommitted || s == StateRolledBack }

// ResolvedBy says what wrote the row.
type ResolvedBy string

// Resolvers of a row.
const (
	ByLocalCommit   ResolvedBy = "LOCAL_COMMIT"   // the local transaction committed it
	ByLocalRollback ResolvedBy = "LOCAL_ROLLBACK" // the producer persisted a local rollback
	ByFence         ResolvedBy = "FENCE"          // a check-back fenced a missing transaction
	ByRecovery      ResolvedBy = "RECOVERY"       // discard recovery fenced a missing transaction
	ByResolver      ResolvedBy = "RESOLVER"       // a caller-supplied resolver decided
)

// RecoveryDecision records what discard recovery did with a half message the
// broker gave up on.
type RecoveryDecision string

// Recovery decisions.
const (
	RecoveryRepublished RecoveryDecision = "REPUBLISHED" // COMMITTED row: published again
	RecoveryDropped     RecoveryDecision = "DROPPED"     // ROLLED_BACK row, or a half that did not commit the row: dropped
	RecoveryFenced      RecoveryDecision = "FENCED"      // no row: fenced, then dropped
	RecoveryConflict    RecoveryDecision = "CONFLICT"    // payload hash differs from the row: dropped
	// RecoveryNoPayload: a COMMITTED row that cannot be published again from
	// the log (no stored payload with DisablePayloadStorage or a resolver's
	// decision, a payload that no longer matches its hash, no topic). The
	// event is NOT delivered: recovery alerts and an operator must publish it.
	RecoveryNoPayload RecoveryDecision = "NO_PAYLOAD"
)

// Row is one transaction log entry.
type Row struct {
	EventID       string     // primary key: the rmqtx event id (the transaction id)
	ProducerGroup string     // producer group that sent the half message
	Topic         string     // destination topic
	Tags          string     // RocketMQ tag
	Keys          string     // RocketMQ keys, space separated
	EventType     string     // envelope event type
	State         State      // COMMITTED or ROLLED_BACK
	Payload       []byte     // message body; nil when payload storage is off or for fence rows
	PayloadHash   string     // hex SHA-256 of the payload (envelope.Hash); may be empty for fence rows
	Properties    string     // JSON object of the message's user properties (envelope); may be empty
	BusinessKey   string     // envelope business key
	CreatedAt     time.Time  // when the row was written (UTC)
	ResolvedAt    time.Time  // when the state was decided (UTC)
	ResolvedBy    ResolvedBy // what decided it
	// Recovery bookkeeping, set by discard recovery.
	RecoveredAt      time.Time        // zero when never recovered
	RecoveryDecision RecoveryDecision // empty when never recovered
	RecoveryNote     string           // free text for humans (never payload)
}

// Sentinel errors. Every error returned by a Store wraps one of these or a
// database error, and starts with "txlog: ".
var (
	// ErrNotFound: no row for the event id.
	ErrNotFound = errors.New("txlog: not found")
	// ErrDuplicate: Insert found an existing row with the same event id
	// (committed earlier, or fenced).
	ErrDuplicate = errors.New("txlog: duplicate event id")
	// ErrInvalid: the arguments are invalid (empty id, bad state, bad prefix).
	ErrInvalid = errors.New("txlog: invalid argument")
	// ErrRetentionTooShort: DeleteTerminalBefore was asked to delete rows
	// younger than MinRetention.
	ErrRetentionTooShort = errors.New("txlog: retention shorter than MinRetention")
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}
