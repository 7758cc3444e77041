package consumer

import (
	"context"
	"fmt"

	"github.com/rmqtx/rmqtx/errclass"
	"github.com/rmqtx/rmqtx/internal/startcheck"
)

// Errors of Consumer.Start. They are errclass's values, so one errors.Is
// test serves txproducer, consumer and outbox.
var (
	// ErrDatabaseUnreachable: Start could not ping Config.DB. The error
	// names the server's host:port and the cause (connection refused,
	// authentication failed, timeout).
	ErrDatabaseUnreachable = errclass.ErrDatabaseUnreachable
	// ErrNameServerUnreachable: no address in Config.NameServers answered
	// as a RocketMQ name server. The error names each address and its cause
	// (connection refused, timeout, not a name server).
	ErrNameServerUnreachable = errclass.ErrNameServerUnreachable
)

// checkReachable is Start's first step: the database, then a name server,
// each bounded by startcheck.Timeout (5 s) and by ctx. Without it a wrong
// address surfaced only in the client's log lines while Start succeeded.
func (c *Consumer) checkReachable(ctx context.Context) error {
	if err := startcheck.Database(ctx, c.proc.db.DB); err != nil {
		return fmt.Errorf("consumer: start: %w", err)
	}
	if err := startcheck.NameServers(ctx, c.cfg.NameServers); err != nil {
		return fmt.Errorf("consumer: start: %w", err)
	}
	return nil
}
