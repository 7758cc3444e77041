package failpoint

// EnvVar arms one failpoint by name in a binary built with -tags failpoints.
const EnvVar = "RMQTX_FAILPOINT"

// Named points. Each is a window between two durable steps.
const (
	// txproducer
	AfterHalfMessage    = "producer.after-half"         // half stored, local tx not begun
	InsideLocalTx       = "producer.inside-local-tx"    // txlog row inserted, not committed
	AfterLocalCommit    = "producer.after-local-commit" // local tx committed, no END_TRANSACTION
	AfterEndTransaction = "producer.after-end-tx"       // END_TRANSACTION sent
	// outbox
	AfterClaim = "outbox.after-claim" // rows SENDING with our token (held claim: locked, unwritten), nothing sent
	AfterSend  = "outbox.after-send"  // broker has the message, row not yet SENT (held claim: not committed)
	// consumer
	AfterConsumeCommit = "consumer.after-commit" // dedup + effect committed, not ACKed
)
