package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/sirupsen/logrus"
)

// logStale says, at Info, that ev was skipped as stale: its aggregate had
// already applied version last >= ev's. A skip is never silent: it is
// recorded STALE in the consume log, counted
// (rmqtx_consumer_stale_versions_total, by group and event type) and logged
// here with the event id, the aggregate and both versions (never the
// payload), because under VersionMonotonic an event that arrives after a
// newer one of its aggregate is dropped for good and its handler never runs.
func (p *Processor) logStale(ev Event, last int64) {
	p.cfg.Logger.WithFields(p.fields(ev)).WithFields(logrus.Fields{
		"aggregate_type": ev.AggregateType, "aggregate_id": ev.AggregateID,
		"aggregate_version": ev.AggregateVersion, "last_applied_version": last,
	}).Info("consumer: stale aggregate version skipped (recorded STALE; the handler did not run)")
}

// ErrSeedVersion wraps the errors of SeedAggregateVersion.
var ErrSeedVersion = errors.New("consumer: seed aggregate version")

// SeedAggregateVersion records that the group has applied version of the
// aggregate (aggregateType, aggregateID), for adopting VersionStrict on
// aggregates whose earlier events were handled before the guard existed
// (or by another system). Without a seed, strict mode expects
// StrictFirstVersion (1) for an aggregate it has no row for, and an event
// at version N > 1 waits as a gap (class Wait, up to MaxWaits redeliveries,
// about 17 minutes with the default delays) and is then parked. With the
// seed, version+1 applies and version or lower is stale.
//
// It only moves a version forward: a row already at version or higher is
// left as it is, so a seed never reopens events that were applied. Run it
// (for example from a migration, for every existing aggregate at its
// current version) before the consumer of the group starts with strict
// mode. README "Adopting VersionStrict on existing aggregates" gives the
// equivalent SQL for seeding many aggregates at once.
func (p *Processor) SeedAggregateVersion(ctx context.Context, aggregateType, aggregateID string, version int64) error {
	if aggregateType == "" || version <= 0 {
		return fmt.Errorf("%w: aggregate type is required and version must be > 0", ErrSeedVersion)
	}
	tx, err := p.db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("%w: begin: %w", ErrSeedVersion, err)
	}
	defer func() { _ = tx.Rollback() }()
	g := p.cfg.Group
	if _, err := tx.ExecContext(ctx, p.q.lockVersion, g, aggregateType, aggregateID); err != nil {
		return fmt.Errorf("%w: lock: %w", ErrSeedVersion, err)
	}
	var last int64
	if err := tx.GetContext(ctx, &last, p.q.selectVersion, g, aggregateType, aggregateID); err != nil {
		return fmt.Errorf("%w: read: %w", ErrSeedVersion, err)
	}
	if last >= version {
		return nil
	}
	if _, err := tx.ExecContext(ctx, p.q.updateVersion, version, "seed", g, aggregateType, aggregateID); err != nil {
		return fmt.Errorf("%w: update: %w", ErrSeedVersion, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("%w: commit: %w", ErrSeedVersion, err)
	}
	return nil
}
