// Package startcheck is what txproducer, consumer and outbox check in Start
// before they report success: the database answers a ping, and a RocketMQ
// name server answers a real request. Without it a wrong address or a
// stopped server surfaced only at the first Send, as a "route info not
// found" or a driver error that hid the cause. Each failure names the
// address (host:port only: never a DSN, so never a password) and the cause,
// and wraps errclass.ErrDatabaseUnreachable or
// errclass.ErrNameServerUnreachable.
package startcheck

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/rmqtx/rmqtx/errclass"
	"github.com/rmqtx/rmqtx/internal/broker/remoting"
	"github.com/rmqtx/rmqtx/internal/dialect"
)

// Timeout bounds each check (ctx may end it sooner): long enough for a
// server across a slow network, short enough that a wrong address fails
// Start in seconds.
const Timeout = 5 * time.Second

// Database pings db. The error wraps errclass.ErrDatabaseUnreachable and
// the driver's error, and names the server's address when the driver's
// configuration tells it.
func Database(ctx context.Context, db *sql.DB) error {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	err := db.PingContext(ctx)
	if err == nil {
		return nil
	}
	where := "database"
	if a := dialect.ServerAddr(db); a != "" {
		where = "database at " + a
	}
	return fmt.Errorf("%w: %s: %s: %w", errclass.ErrDatabaseUnreachable, where, cause(ctx, err), err)
}

// NameServers asks each name server in turn for the cluster's brokers
// (GET_BROKER_CLUSTER_INFO), and returns nil at the first that answers as a
// name server. A broker or another service on that port answers otherwise
// (a broker: "request type 106 not supported"), so a wrong port is told
// apart from a refused connection. The error wraps
// errclass.ErrNameServerUnreachable and names every address with its cause.
func NameServers(ctx context.Context, addrs []string) error {
	var fails []string
	var last error
	for _, a := range addrs {
		h, _, err := remoting.RoundTrip(ctx, a, Timeout, remoting.ReqGetBrokerClusterInfo, nil)
		switch {
		case err != nil:
			last = err
			fails = append(fails, fmt.Sprintf("%s: %s (%v)", a, cause(ctx, err), err))
		case h.Code != remoting.ResSuccess:
			fails = append(fails, fmt.Sprintf("%s: not a name server (answered code %d: %s)", a, h.Code, oneLine(h.Remark)))
		default:
			return nil
		}
	}
	if len(fails) == 0 {
		return fmt.Errorf("%w: no name server configured", errclass.ErrNameServerUnreachable)
	}
	if last != nil && len(fails) == 1 {
		return fmt.Errorf("%w: %s: %w", errclass.ErrNameServerUnreachable, strings.Join(fails, "; "), last)
	}
	return fmt.Errorf("%w: %s", errclass.ErrNameServerUnreachable, strings.Join(fails, "; "))
}

// cause is a short name for why err happened: "connection refused",
// "authentication failed", "timeout", "not a RocketMQ server" (a frame
// that does not parse), or "error".
func cause(ctx context.Context, err error) string {
	var nerr net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case dialect.IsAuthFailure(err):
		return "authentication failed"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &nerr) && nerr.Timeout(), ctx.Err() != nil:
		return "timeout"
	case strings.Contains(err.Error(), "bad frame length"), strings.Contains(err.Error(), "serialize type"),
		strings.Contains(err.Error(), "decode header"):
		return "not a RocketMQ server"
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return "unknown host"
	}
	return "error"
}

func oneLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return strings.TrimSpace(s)
}
