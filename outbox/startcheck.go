package outbox

import (
	"context"
	"fmt"

	"github.com/rmqtx/rmqtx/errclass"
	"github.com/rmqtx/rmqtx/internal/startcheck"
)

// Errors of Dispatcher.Start. They are errclass's values, so one errors.Is
// test serves txproducer, consumer and outbox.
var (
	// ErrDatabaseUnreachable: Start could not ping Config.DB. The error
	// names the server's host:port and the cause (connection refused,
	// authentication failed, timeout).
	ErrDatabaseUnreachable = errclass.ErrDatabaseUnreachable
	// ErrNameServerUnreachable: the sink is a RocketMQSink and none of its
	// name servers answered as one. The error names each address and its
	// cause (connection refused, timeout, not a name server).
	ErrNameServerUnreachable = errclass.ErrNameServerUnreachable
)

// reachabilityChecker is a Sink that can tell, before the first send,
// whether what it sends to is there (RocketMQSink: a name server).
type reachabilityChecker interface {
	checkReachable(ctx context.Context) error
}

// checkReachable is Dispatcher.Start's first step: the database, then the
// sink's own check when it has one. Each is bounded by startcheck.Timeout
// (5 s) and by ctx.
func (d *Dispatcher) checkReachable(ctx context.Context) error {
	if err := startcheck.Database(ctx, d.cfg.DB.DB); err != nil {
		return fmt.Errorf("outbox: start: %w", err)
	}
	if c, ok := d.cfg.Sink.(reachabilityChecker); ok {
		if err := c.checkReachable(ctx); err != nil {
			return fmt.Errorf("outbox: start: %w", err)
		}
	}
	return nil
}

// checkReachable asks the sink's name servers for the cluster's brokers:
// the client's own Start does not contact them, so a wrong address would
// otherwise surface only as "route info not found" at the first send.
func (s *RocketMQSink) checkReachable(ctx context.Context) error {
	return startcheck.NameServers(ctx, s.nameServers)
}
