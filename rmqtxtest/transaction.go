package rmqtxtest

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// Transactions, as the real broker runs them: a half is stored aside (the
// RMQ_SYS_TRANS_HALF_TOPIC) with its real topic and queue in REAL_TOPIC and
// REAL_QID; END_TRANSACTION COMMIT stores it on its real topic, ROLLBACK
// drops it; a pending half is checked (CHECK_TRANSACTION_STATE to a
// producer connection of its group, which answers with END_TRANSACTION
// fromTransactionCheck=true), and after CheckMax checks it is discarded to
// TRANS_CHECK_MAX_TIME_TOPIC with all its properties. Unlike the real
// broker, checks run only when the test asks (CheckNow, Advance).

type halfState int

const (
	halfPending halfState = iota
	halfCommitted
	halfRolledBack
	halfDiscarded
)

// half is a transaction half and its fate.
type half struct {
	rec       *record // topic RMQ_SYS_TRANS_HALF_TOPIC, queue 0
	group     string
	realTopic string
	realQueue int
	checks    int
	bornAt    time.Time // broker clock
	state     halfState
}

// Half is a transaction half as a test sees it: its Message has the real
// topic and queue; Checks counts the check rounds it went through (its
// TRANSACTION_CHECK_TIMES), BornAt is when the broker stored it (on the
// broker's clock).
type Half struct {
	Message
	Group  string
	Checks int
	BornAt time.Time
}

// putHalfLocked stores r as a half of group.
func (b *Broker) putHalfLocked(r *record, group string) *half {
	if g := r.props["PGROUP"]; g != "" {
		group = g
	}
	hf := &half{group: group, realTopic: r.topic, realQueue: r.queueID, bornAt: b.clock}
	r.props["REAL_TOPIC"] = r.topic
	r.props["REAL_QID"] = strconv.Itoa(r.queueID)
	r.sysFlag = r.sysFlag&^sysFlagTxMask | sysFlagPrepared
	r.topic, r.queueID = halfTopic, 0
	r.queueOffset = b.halfNext
	b.halfNext++
	b.storeLocked(r)
	hf.rec = r
	b.halves = append(b.halves, hf)
	b.halfByOff[r.commitOffset] = hf
	b.broadcastLocked()
	return hf
}

func (b *Broker) halfView(hf *half) Half {
	m := b.messageOf(hf.rec)
	m.Topic, m.QueueID = hf.realTopic, hf.realQueue
	return Half{Message: m, Group: hf.group, Checks: hf.checks, BornAt: hf.bornAt}
}

func (b *Broker) halvesIn(state halfState) []Half {
	b.lock()
	defer b.unlock()
	var out []Half
	for _, hf := range b.halves {
		if hf.state == state {
			out = append(out, b.halfView(hf))
		}
	}
	return out
}

// Pending returns the halves neither committed nor rolled back nor
// discarded, in the order they were stored.
func (b *Broker) Pending() []Half { return b.halvesIn(halfPending) }

// RolledBack returns the halves rolled back, in the order they were stored.
func (b *Broker) RolledBack() []Half { return b.halvesIn(halfRolledBack) }

// LoseEndTransaction drops the next n END_TRANSACTION requests unanswered
// and unapplied: their halves stay pending, as when the one-way end of a
// producer never reached the broker. Every Send of txproducer sends one:
// the client's one-way end for a Send without a key, txproducer's answered
// one for a Send with a business key or an aggregate (which then waits
// KitSendTimeout for the answer). A dropped answer to a check still counts
// as the check's answer for CheckNow and Advance.
func (b *Broker) LoseEndTransaction(n int) {
	b.lock()
	defer b.unlock()
	b.loseEnd += n
}

// handleEndTransaction commits or rolls back the half at commitLogOffset.
// The client sends it one-way; rmqtx's ordered commit sends it as a
// request and waits for the answer, so one is given unless one-way.
func (b *Broker) handleEndTransaction(req *command) *command {
	off := req.extInt("commitLogOffset")
	kind := int32(req.extInt("commitOrRollback"))
	fromCheck := req.extBool("fromTransactionCheck")
	b.lock()
	defer b.unlock()
	defer b.broadcastLocked()
	if fromCheck {
		b.checkSeen[off]++
	}
	if b.loseEnd > 0 {
		b.loseEnd--
		b.log.WithField("commitLogOffset", off).Debug("rmqtxtest: END_TRANSACTION lost (LoseEndTransaction)")
		return nil
	}
	hf := b.halfByOff[off]
	if hf == nil {
		return newResponse(req, codeSystemError, "Find prepared transaction message failed", nil)
	}
	switch kind {
	case sysFlagCommit:
		if hf.state != halfPending {
			return newResponse(req, codeSystemError, "Find prepared transaction message failed", nil)
		}
		hf.state = halfCommitted
		r := hf.rec.clone()
		r.topic, r.queueID = hf.realTopic, hf.realQueue
		delete(r.props, "REAL_TOPIC")
		delete(r.props, "REAL_QID")
		delete(r.props, "TRAN_MSG")
		r.sysFlag = r.sysFlag&^sysFlagTxMask | sysFlagCommit
		r.preparedOffset = hf.rec.commitOffset
		r.storeTimestamp = b.clock.UnixMilli()
		b.publishLocked(r)
		return newResponse(req, codeSuccess, "", nil)
	case sysFlagRollback:
		if hf.state == halfPending {
			hf.state = halfRolledBack
			b.broadcastLocked()
		}
		return newResponse(req, codeSuccess, "", nil)
	}
	// TRANSACTION_NOT_TYPE (the local transaction is unknown): the half
	// stays pending; the real broker answers nothing.
	return nil
}

// check is a check request to send after the state lock is released.
type check struct {
	offset int64
	seen   int
}

// CheckNow sends a check for every pending half, whatever its age, and
// waits for the answers (one round, as the broker's check service runs).
// It returns the number of checks sent: a half with no connected producer
// of its group is not checked (its check round is counted in its Checks
// all the same, as the real broker counts it). A half checked CheckMax
// times is discarded instead (see DiscardHalves).
func (b *Broker) CheckNow(ctx context.Context) (int, error) {
	return b.checkRound(ctx, false)
}

// Advance moves the broker's clock by d, releases the delayed retries whose
// time has come (Options.KeepRetryDelays), then checks every pending half
// at least CheckImmunity old (one round, as CheckNow). It returns when
// every check it sent was answered or ctx ends, with the number of checks
// sent.
func (b *Broker) Advance(ctx context.Context, d time.Duration) (int, error) {
	b.lock()
	if b.closed {
		b.unlock()
		return 0, ErrClosed
	}
	b.clock = b.clock.Add(d)
	b.releaseDueLocked()
	b.broadcastLocked()
	b.unlock()
	return b.checkRound(ctx, true)
}

func (b *Broker) checkRound(ctx context.Context, immunity bool) (int, error) {
	b.lock()
	if b.closed {
		b.unlock()
		return 0, ErrClosed
	}
	var sent []check
	for _, hf := range b.halves {
		if hf.state != halfPending {
			continue
		}
		if immunity && b.clock.Sub(hf.bornAt) < b.opts.CheckImmunity {
			continue
		}
		if hf.checks >= b.opts.CheckMax {
			b.discardLocked(hf)
			continue
		}
		hf.checks++
		hf.rec.props["TRANSACTION_CHECK_TIMES"] = strconv.Itoa(hf.checks)
		c := b.producerConnLocked(hf.group)
		if c == nil {
			b.log.WithField("group", hf.group).Debug("rmqtxtest: no producer connection of the half's group; check not sent")
			continue
		}
		msg := hf.rec.clone()
		msg.topic, msg.queueID = hf.realTopic, hf.realQueue
		id := offsetMsgID(b.storeHost, hf.rec.commitOffset)
		uniq := hf.rec.props["UNIQ_KEY"]
		b.sendLocked(c, &command{Code: reqCheckTransaction, Language: "JAVA", Version: remotingVersion,
			Opaque: nextOpaque(), Flag: flagOneway, ExtFields: map[string]string{
				"tranStateTableOffset": strconv.FormatInt(hf.rec.queueOffset, 10),
				"commitLogOffset":      strconv.FormatInt(hf.rec.commitOffset, 10),
				"msgId":                uniq, "transactionId": uniq, "offsetMsgId": id,
			}, Body: msg.encode(b.storeHost)})
		sent = append(sent, check{offset: hf.rec.commitOffset, seen: b.checkSeen[hf.rec.commitOffset]})
	}
	b.broadcastLocked()
	b.unlock()
	return len(sent), b.awaitAnswers(ctx, sent)
}

// awaitAnswers waits until each check of sent got an answer.
func (b *Broker) awaitAnswers(ctx context.Context, sent []check) error {
	for {
		b.lock()
		missing := 0
		for _, c := range sent {
			if b.checkSeen[c.offset] <= c.seen {
				missing++
			}
		}
		closed := b.closed
		ch := b.changed
		b.unlock()
		if missing == 0 {
			return nil
		}
		if closed {
			return ErrClosed
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("rmqtxtest: %d of %d checks unanswered: %w", missing, len(sent), ctx.Err())
		}
	}
}

// producerConnLocked returns the first live connection (in connection
// order) that registered a producer of group, nil if none.
func (b *Broker) producerConnLocked(group string) *conn {
	var best *conn
	for c := range b.conns {
		if c.ns || !c.groups[group] {
			continue
		}
		if best == nil || c.seq < best.seq {
			best = c
		}
	}
	return best
}

// DiscardHalves discards every pending half now, as the broker does after
// CheckMax checks: each goes to TRANS_CHECK_MAX_TIME_TOPIC (which discard
// recovery consumes) with all its properties. It returns how many.
func (b *Broker) DiscardHalves(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("rmqtxtest: discard halves: %w", err)
	}
	b.lock()
	defer b.unlock()
	if b.closed {
		return 0, ErrClosed
	}
	n := 0
	for _, hf := range b.halves {
		if hf.state == halfPending {
			b.discardLocked(hf)
			n++
		}
	}
	return n, nil
}

// discardLocked writes hf to the discard topic (one queue), keeping its
// properties, flags, born host and times (the broker's
// toMessageExtBrokerInner).
func (b *Broker) discardLocked(hf *half) {
	hf.state = halfDiscarded
	r := hf.rec.clone()
	r.topic, r.queueID = discardTopic, 0
	r.storeTimestamp = b.clock.UnixMilli()
	b.storeLocked(r)
	b.appendLocked(r)
	b.log.WithField("group", hf.group).Debug("rmqtxtest: half discarded")
}
