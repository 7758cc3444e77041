package txproducer

import (
	"context"
	"errors"
	"fmt"

	"github.com/rmqtx/rmqtx/errclass"
	"github.com/rmqtx/rmqtx/internal/startcheck"
)

// Errors of Start. RetryAdvice of any of them is DontRetry: they are not
// Send errors, no event id is involved, and what helps is fixing the
// address or the server and calling Start again.
var (
	// ErrStart is wrapped by every error Start returns except ErrClosed
	// and ErrConfig (a BrokerSettingsError): the producer did not start.
	ErrStart = errors.New("txproducer: start")
	// ErrDatabaseUnreachable: Start could not ping Config.DB. The error
	// names the server's host:port and the cause (connection refused,
	// authentication failed, timeout). It is errclass.ErrDatabaseUnreachable,
	// the value consumer and outbox return too.
	ErrDatabaseUnreachable = errclass.ErrDatabaseUnreachable
	// ErrNameServerUnreachable: no address in Config.NameServers answered
	// as a RocketMQ name server. The error names each address and its cause
	// (connection refused, timeout, not a name server). It is
	// errclass.ErrNameServerUnreachable.
	ErrNameServerUnreachable = errclass.ErrNameServerUnreachable
)

// Start checks that the database answers a ping and that a name server
// answers a request (each bounded by 5 s and by ctx: a wrong address fails
// here, naming it and the cause, instead of at the first Send), checks
// FenceAge against the brokers' settings (see Config.FenceAge), warns,
// naming the broker, about one that acknowledges messages it has neither
// flushed nor copied to a synchronous slave (flushDiskType ASYNC_FLUSH on a
// broker that is not a SYNC_MASTER: a power loss there can lose committed
// events, see brokercheck.go's warnDurability), connects
// to the name server, warms up (see Config.WarmupTopics), starts discard
// recovery, and begins answering checks. With WarmupTopics it returns once
// every broker of those topics has registered this instance (see
// warmup.go), so checks for older transactions of the group can reach it
// before its first Send. It then watches the cluster's masters
// (Config.BrokerWatchInterval) and registers this instance at once with a
// broker that restarts (see rejoin.go).
//
// Its errors wrap ErrStart (ErrDatabaseUnreachable and
// ErrNameServerUnreachable among them), except ErrClosed and the ErrConfig
// of a FenceAge that does not fit a broker.
func (p *Producer) Start(ctx context.Context) error {
	err := p.start(ctx)
	if err == nil || errors.Is(err, ErrStart) || errors.Is(err, ErrClosed) || errors.Is(err, ErrConfig) {
		return err
	}
	return startError{err}
}

// startError adds ErrStart to an error of Start without repeating the
// prefix its text already has.
type startError struct{ err error }

func (e startError) Error() string   { return e.err.Error() }
func (e startError) Unwrap() []error { return []error{ErrStart, e.err} }

// checkReachable is Start's first step: the database, then a name server.
func (p *Producer) checkReachable(ctx context.Context) error {
	if err := startcheck.Database(ctx, p.db.DB); err != nil {
		return fmt.Errorf("%w: %w", ErrStart, err)
	}
	if err := startcheck.NameServers(ctx, p.cfg.NameServers); err != nil {
		return fmt.Errorf("%w: %w", ErrStart, err)
	}
	return nil
}
