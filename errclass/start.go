package errclass

import "errors"

// Errors of a component's Start, shared so that one errors.Is test serves
// txproducer, consumer and outbox (each re-exports them under its own
// name; the values are these). The error that wraps one names the address
// (host:port, never a password) and the cause: connection refused, an
// authentication failure, a timeout, or "not a name server".
var (
	// ErrDatabaseUnreachable: Start could not ping the database.
	ErrDatabaseUnreachable = errors.New("database unreachable")
	// ErrNameServerUnreachable: Start reached no RocketMQ name server that
	// answers as one.
	ErrNameServerUnreachable = errors.New("name server unreachable")
	// ErrTopicNotFound: a topic Start must send to does not exist, and the
	// broker does not create topics on first use (autoCreateTopicEnable
	// is false, as on most production clusters): an operator creates it
	// (mqadmin updateTopic, or rmqtx topic create). The error names the
	// topic.
	ErrTopicNotFound = errors.New("topic not found")
)
