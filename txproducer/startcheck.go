package txproducer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/rmqtx/rmqtx/errclass"
	"github.com/rmqtx/rmqtx/internal/dialect"
	"github.com/rmqtx/rmqtx/internal/sqltime"
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
	// ErrClockSkew: this host's clock is more than MaxClockSkew(FenceAge)
	// away from the database's (see checkClock). The error names both
	// readings, the measured skew and the bound. Fix the host's time
	// synchronisation (NTP) and call Start again.
	ErrClockSkew = errors.New("txproducer: clock skew")
)

// Start checks that the database answers a ping and that a name server
// answers a request (each bounded by 5 s and by ctx: a wrong address fails
// here, naming it and the cause, instead of at the first Send), checks
// that this host's clock is within MaxClockSkew(FenceAge) of the
// database's (ErrClockSkew, see checkClock), checks FenceAge against the brokers' settings (see Config.FenceAge), warns,
// naming the broker, about one that acknowledges messages it has neither
// flushed nor copied to a synchronous slave (flushDiskType ASYNC_FLUSH on a
// broker that is not a SYNC_MASTER: a power loss there can lose committed
// events, see brokercheck.go's warnDurability) and about replication
// settings under which a failover loses acknowledged messages
// (warnFailover: controller mode without allAckInSyncStateSet, or with
// enableElectUncleanMaster), connects
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
	if err := p.checkClock(ctx); err != nil {
		return err
	}
	if err := startcheck.NameServers(ctx, p.cfg.NameServers); err != nil {
		return fmt.Errorf("%w: %w", ErrStart, err)
	}
	return nil
}

// MaxClockSkew is the largest distance between this host's clock and the
// database's that Start accepts for a producer with the given FenceAge:
// FenceAge/2.
//
// Why: a check computes a half message's age from two clocks, its own
// instance's now minus the half's born time, which the SENDING instance's
// clock stamped (checkback.Checker). With every instance within B of the
// database's clock, two instances differ by at most 2B, so a check fences
// a half with no txlog row between FenceAge-2B and FenceAge+2B after it
// was really born. At B = FenceAge/2 the lower end reaches 0: a checker
// could fence a half at its first check however young it is, and the fence
// age would no longer give a local transaction time to write its row (the
// upper end, 2 x FenceAge, leaves more halves to discard recovery). No
// decision becomes wrong even then: a fence is an INSERT the database
// arbitrates (it waits on a running local transaction's row lock, and a
// local transaction that had not written its row yet fails on the fence's
// row and is rolled back), and the retake rule compares clocks only
// through the fence age itself (see txlog.Store.Retake). So the bound
// protects the fence age's meaning, not invariants I1 to I3.
func MaxClockSkew(fenceAge time.Duration) time.Duration { return fenceAge / 2 }

// checkClock reads the database's clock once (the dialect's now, one
// SELECT) and compares it with this host's clock at the middle of the
// round trip. It refuses (ErrClockSkew) when the two are certainly more
// than MaxClockSkew(FenceAge) apart (the round trip's half is the
// measurement's uncertainty and counts in the host's favour), and warns
// above a tenth of FenceAge. Every instance of a group checks itself
// against the one database they share, which bounds the skew between any
// two of them (see MaxClockSkew). A database that cannot be read here was
// reachable a moment ago (the ping): the skew is logged as unchecked and
// Start goes on; the Send path reports a database that stays away.
func (p *Producer) checkClock(ctx context.Context) error {
	now := p.cfg.Test.Now
	if now == nil {
		now = time.Now
	}
	l := p.cfg.Logger
	d, err := dialect.For(p.db)
	if err != nil {
		l.WithError(err).Info("txproducer: clock skew not checked")
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, startcheck.Timeout)
	defer cancel()
	var db sqltime.Time
	t0 := now()
	err = p.db.QueryRowContext(ctx, "SELECT "+d.Now()).Scan(&db)
	t1 := now()
	if err != nil {
		l.WithError(err).Info("txproducer: could not read the database's clock; clock skew not checked")
		return nil
	}
	half := t1.Sub(t0) / 2
	local := t0.Add(half)
	skew := db.Time.Sub(local) // > 0: the database's clock is ahead of ours
	abs := skew
	if abs < 0 {
		abs = -abs
	}
	certain := abs - half // the least the skew can be
	bound := MaxClockSkew(p.cfg.FenceAge)
	fields := logrus.Fields{"local_clock": local.UTC().Format(time.RFC3339Nano), "database_clock": db.Time.UTC().Format(time.RFC3339Nano),
		"skew": skew.String(), "uncertainty": half.String(), "bound": bound.String()}
	switch {
	case certain > bound:
		return fmt.Errorf("%w: %w: this host's clock reads %s, the database's %s: %s apart (+-%s), more than FenceAge/2 = %s "+
			"(checks would fence halves regardless of their age); synchronise the host's clock",
			ErrStart, ErrClockSkew, local.UTC().Format(time.RFC3339Nano), db.Time.UTC().Format(time.RFC3339Nano), abs, half, bound)
	case certain > p.cfg.FenceAge/10:
		l.WithFields(fields).Warn("txproducer: this host's clock is away from the database's; checks fence halves earlier or later by the skew between instances (refused above FenceAge/2)")
	default:
		l.WithFields(fields).Debug("txproducer: clock skew against the database")
	}
	return nil
}
