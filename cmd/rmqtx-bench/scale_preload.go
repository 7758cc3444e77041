package main

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/consumer"
	"github.com/rmqtx/rmqtx/outbox"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/wire"
)

// Id layouts of the scale workload (-scale-ids).
const (
	// idsTime: ids assigned by rmqtx (wire.NewEventID, UUIDv7): they sort
	// by creation time, so new rows go to the right edge of every B-tree
	// keyed on them.
	idsTime = "time"
	// idsHashed: ids derived from business keys (a UUIDv5 of the event type
	// and the key, as the README recommends): uniformly spread, so every
	// insert lands on a random leaf page.
	idsHashed = "hashed"
)

// Preload shape constants: what real traffic leaves in the tables.
const (
	scaleSpan  = 28 * 24 * time.Hour // timestamps spread over four weeks, oldest first
	scaleChunk = 1_000_000           // rows per INSERT ... SELECT
	// Hashed ids land on random pages: a million of them in one statement
	// outlast the 60 s readTimeout of the services' MySQL DSN.
	scaleChunkHashed = 100_000
	scaleRolledEvery = 50   // every 50th txlog row is a fence (ROLLED_BACK): 2 %
	scaleTailPerMill = 1    // newest 0.1 % of the outbox and the consumer rows are unfinished,
	scaleTailMax     = 1000 // up to this many: unfinished work follows failures, not the table's age
	scaleEventType   = benchEventType
)

// preloadShape describes the N rows a scale point preloads into the txlog,
// the consume log and the outbox. Row seq (1..Rows) is the same event in the
// three tables. Everything a measurement later needs about an old row (its
// id, its payload, its payload hash) is a pure function of seq, computed the
// same way here and by the database's own set generator (preloadSQL), so
// the measurements can pick old rows at random without reading them first.
type preloadShape struct {
	Rows     int64
	IDs      string    // idsTime or idsHashed
	Salt     string    // makes the ids unique to the run
	Base     time.Time // created_at of seq 0 (UTC, whole milliseconds)
	Payload  int       // payload bytes of a txlog/outbox row (>= 12)
	Group    string    // producer group of the txlog rows
	CGroup   string    // consumer group of the consume-log rows
	Topic    string    // topic / outbox destination
	TailFrom int64     // first seq of the unfinished tail (Rows+1: none)
}

// newPreloadShape returns the shape of rows rows ending now.
func newPreloadShape(rows int64, ids, salt string, payload int, now time.Time, group, cgroup, topic string) preloadShape {
	if payload < 12 {
		payload = 12
	}
	tail := min(rows*scaleTailPerMill/1000, scaleTailMax)
	return preloadShape{
		Rows: rows, IDs: ids, Salt: salt, Base: now.Add(-scaleSpan).UTC().Truncate(time.Millisecond),
		Payload: payload, Group: group, CGroup: cgroup, Topic: topic, TailFrom: rows - tail + 1,
	}
}

// stepMicros is the time between two consecutive rows.
func (p preloadShape) stepMicros() int64 {
	if p.Rows <= 0 {
		return 0
	}
	return scaleSpan.Microseconds() / p.Rows
}

// createdAt is row seq's created_at.
func (p preloadShape) createdAt(seq int64) time.Time {
	return p.Base.Add(time.Duration(seq*p.stepMicros()) * time.Microsecond)
}

func md5hex(s string) string {
	sum := md5.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}

// idSeed and keySeed are the strings the database hashes for row seq.
func (p preloadShape) idSeed(seq int64) string { return p.Salt + "/" + strconv.FormatInt(seq, 10) }
func (p preloadShape) businessKey(seq int64) string {
	return "order-" + p.Salt + "-" + strconv.FormatInt(seq, 10)
}

// eventID is row seq's event id: a UUIDv7 layout (48-bit millisecond
// timestamp of createdAt, then random bits) for idsTime, a UUIDv5 layout
// (every bit from a hash of the business key) for idsHashed. The random
// bits are MD5 of a seed, which both databases compute natively.
func (p preloadShape) eventID(seq int64) string {
	if p.IDs == idsHashed {
		k := md5hex(p.businessKey(seq))
		return k[0:8] + "-" + k[8:12] + "-5" + k[12:15] + "-8" + k[15:18] + "-" + k[18:30]
	}
	ms := p.Base.UnixMilli() + seq*p.stepMicros()/1000
	h := fmt.Sprintf("%012x", ms)
	r := md5hex(p.idSeed(seq))
	return h[0:8] + "-" + h[8:12] + "-7" + r[0:3] + "-8" + r[3:6] + "-" + r[6:18]
}

// payload is row seq's payload: the seq, zero-padded to 12 digits, then
// filler up to Payload bytes.
func (p preloadShape) payload(seq int64) []byte {
	return []byte(fmt.Sprintf("%012d", seq) + strings.Repeat("x", p.Payload-12))
}

// payloadHash is wire.Hash of payload(seq): the txlog's payload_hash and
// the consume log's request_hash.
func (p preloadShape) payloadHash(seq int64) string { return wire.Hash(p.payload(seq)) }

// committed reports whether txlog row seq is COMMITTED (else a fence).
func (p preloadShape) committed(seq int64) bool { return seq%scaleRolledEvery != 0 }

// applied reports whether the consumer applied row seq (a consume-log
// row); the tail is still being retried (a consume_attempt row).
func (p preloadShape) applied(seq int64) bool { return seq < p.TailFrom }

// chunks splits 1..Rows into [lo, hi] ranges of at most size rows.
func chunks(rows, size int64) [][2]int64 {
	var out [][2]int64
	for lo := int64(1); lo <= rows; lo += size {
		out = append(out, [2]int64{lo, min(lo+size-1, rows)})
	}
	return out
}

// preloadSQL builds the INSERT ... SELECT statements for rows lo..hi of
// every table, for engine (engineMySQL: MariaDB's SEQUENCE engine table
// seq_<lo>_to_<hi>; enginePostgres: generate_series). Table names come
// from the owners' constructors (validated); every other value is a number
// or a name of this run, quoted here.
type preloadTables struct {
	Txlog, Outbox, ConsumeLog, Attempt string
}

func quoteLit(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func (p preloadShape) preloadSQL(engine string, t preloadTables, lo, hi int64) []string {
	pg := engine == enginePostgres
	step := strconv.FormatInt(p.stepMicros(), 10)
	baseMs := strconv.FormatInt(p.Base.UnixMilli(), 10)
	baseLit := p.Base.Format("2006-01-02 15:04:05.000000")
	fill := strconv.Itoa(p.Payload - 12)

	var (
		from, hexTime, payload, hash, created, upper string
	)
	if pg {
		from = fmt.Sprintf("generate_series(CAST(%d AS BIGINT), CAST(%d AS BIGINT)) AS s(seq)", lo, hi)
		hexTime = "lpad(to_hex(" + baseMs + " + (seq * " + step + ") / 1000), 12, '0')"
		payload = "convert_to(lpad(CAST(seq AS TEXT), 12, '0') || repeat('x', " + fill + "), 'UTF8')"
		hash = "encode(sha256(p), 'hex')"
		created = "(TIMESTAMPTZ '" + baseLit + "+00' + (seq * " + step + ") * INTERVAL '1 microsecond')"
		upper = "upper"
	} else {
		from = fmt.Sprintf("seq_%d_to_%d", lo, hi)
		hexTime = "LPAD(LOWER(HEX(" + baseMs + " + (seq * " + step + ") DIV 1000)), 12, '0')"
		payload = "CONCAT(LPAD(seq, 12, '0'), REPEAT('x', " + fill + "))"
		hash = "SHA2(p, 256)"
		created = "TIMESTAMPADD(MICROSECOND, seq * " + step + ", '" + baseLit + "')"
		upper = "UPPER"
	}
	saltLit := quoteLit(p.Salt + "/")
	keyLit := quoteLit("order-" + p.Salt + "-")
	// a: per-row hashes; b: the id and the payload; c: the payload hash.
	idExpr := "CONCAT(SUBSTR(h, 1, 8), '-', SUBSTR(h, 9, 4), '-7', SUBSTR(r, 1, 3), '-8', SUBSTR(r, 4, 3), '-', SUBSTR(r, 7, 12))"
	if p.IDs == idsHashed {
		idExpr = "CONCAT(SUBSTR(k, 1, 8), '-', SUBSTR(k, 9, 4), '-5', SUBSTR(k, 13, 3), '-8', SUBSTR(k, 16, 3), '-', SUBSTR(k, 19, 12))"
	}
	rows := "SELECT seq, id, p, " + hash + " AS ph, created, bk, uk FROM (" +
		"SELECT seq, " + idExpr + " AS id, " + payload + " AS p, " + created + " AS created, CONCAT(" + keyLit + ", seq) AS bk, " + upper + "(r) AS uk FROM (" +
		"SELECT seq, " + hexTime + " AS h, md5(CONCAT(" + saltLit + ", seq)) AS r, md5(CONCAT(" + keyLit + ", seq)) AS k FROM " + from +
		") a) b"
	ev := quoteLit(scaleEventType)
	rolled := fmt.Sprintf("seq %% %d = 0", scaleRolledEvery)
	tail := fmt.Sprintf("seq >= %d", p.TailFrom)
	notTail := fmt.Sprintf("seq < %d", p.TailFrom)
	later := func(ms int) string { // created + ms milliseconds
		if pg {
			return fmt.Sprintf("created + INTERVAL '%d milliseconds'", ms)
		}
		return fmt.Sprintf("TIMESTAMPADD(MICROSECOND, %d, created)", ms*1000)
	}
	// The unfinished outbox tail is backing off: RETRY, next try an hour
	// from now, so no claim picks it up during the run.
	retryAt := "TIMESTAMPADD(HOUR, 1, UTC_TIMESTAMP(6))"
	if pg {
		retryAt = "now() + INTERVAL '1 hour'"
	}
	props := "CONCAT('{\"" + wire.PropBusinessKey + "\":\"', bk, '\",\"" + wire.PropEventID + "\":\"', id, '\",\"" + wire.PropEventType + "\":\"" + scaleEventType +
		"\",\"" + wire.PropEventVersion + "\":\"0\",\"" + wire.PropFormatVersion + "\":\"1\",\"" + wire.PropPayloadHash + "\":\"', ph, '\",\"" + txlog.HalfProperty + "\":\"', uk, '\"}')"
	fenceProps := "CONCAT('{\"" + txlog.HalfProperty + "\":\"', uk, '\"}')"

	txl := "INSERT INTO " + t.Txlog + " (event_id, producer_group, topic, tags, msg_keys, event_type, state, payload, payload_hash, properties, business_key, created_at, resolved_at, resolved_by) " +
		"SELECT id, " + quoteLit(p.Group) + ", " + quoteLit(p.Topic) + ", " + ev + ", CONCAT(bk, ' ', id), " + ev + ", " +
		"CASE WHEN " + rolled + " THEN '" + string(txlog.StateRolledBack) + "' ELSE '" + string(txlog.StateCommitted) + "' END, " +
		"CASE WHEN " + rolled + " THEN NULL ELSE p END, " +
		"CASE WHEN " + rolled + " THEN '' ELSE ph END, " +
		"CASE WHEN " + rolled + " THEN " + fenceProps + " ELSE " + props + " END, bk, created, " +
		"CASE WHEN " + rolled + " THEN " + later(60000) + " ELSE created END, " +
		"CASE WHEN " + rolled + " THEN '" + string(txlog.ByFence) + "' ELSE '" + string(txlog.ByLocalCommit) + "' END FROM (" + rows + ") c"
	ob := "INSERT INTO " + t.Outbox + " (event_id, event_type, destination, message_key, payload, status, retry_count, next_retry_at, last_error_code, last_error_message, created_at, sent_at, updated_at) " +
		"SELECT id, " + ev + ", " + quoteLit(p.Topic) + ", bk, p, " +
		"CASE WHEN " + tail + " THEN '" + string(outbox.StatusRetry) + "' ELSE '" + string(outbox.StatusSent) + "' END, " +
		"CASE WHEN " + tail + " THEN 3 ELSE 0 END, " +
		"CASE WHEN " + tail + " THEN " + retryAt + " ELSE " + later(20) + " END, " + // SENT: stamped when sent, as the dispatcher does

		"CASE WHEN " + tail + " THEN 'SEND_FAILED' ELSE NULL END, " +
		"CASE WHEN " + tail + " THEN 'bench: preloaded retry' ELSE NULL END, created, " +
		"CASE WHEN " + tail + " THEN NULL ELSE " + later(20) + " END, " +
		"CASE WHEN " + tail + " THEN " + later(1000) + " ELSE " + later(20) + " END FROM (" + rows + ") c"
	cl := "INSERT INTO " + t.ConsumeLog + " (consumer_group, event_id, event_type, request_hash, status, retry_count, first_received_at, updated_at) " +
		"SELECT " + quoteLit(p.CGroup) + ", id, " + ev + ", ph, '" + consumer.StatusApplied + "', 0, " + later(40) + ", " + later(45) +
		" FROM (" + rows + ") c WHERE " + notTail
	at := "INSERT INTO " + t.Attempt + " (consumer_group, event_id, attempts, last_class, last_error, first_failed_at, updated_at) " +
		"SELECT " + quoteLit(p.CGroup) + ", id, 2, '" + string(consumer.ClassTransient) + "', 'bench: preloaded retry', " + later(40) + ", " + later(2000) +
		" FROM (" + rows + ") c WHERE " + tail
	out := []string{txl, ob, cl}
	if hi >= p.TailFrom {
		out = append(out, at)
	}
	return out
}

// preloadResult is what a preload took.
type preloadResult struct {
	Rows    int64   // rows written, all tables
	Seconds float64 // INSERT ... SELECT time
	Analyze float64 // statistics refresh afterwards
}

// preload fills the tables with p's rows, chunk rows a statement, then refreshes the
// planner's statistics (a service's tables have them).
func preload(ctx context.Context, db *sqlx.DB, engine string, t preloadTables, p preloadShape, chunk int64, logf func(string, ...any)) (preloadResult, error) {
	var res preloadResult
	if p.Rows <= 0 {
		return res, nil
	}
	t0 := time.Now()
	for _, c := range chunks(p.Rows, chunk) {
		for _, q := range p.preloadSQL(engine, t, c[0], c[1]) {
			r, err := db.ExecContext(ctx, q)
			if err != nil {
				return res, fmt.Errorf("preload rows %d..%d: %w", c[0], c[1], err)
			}
			n, _ := r.RowsAffected()
			res.Rows += n
		}
		logf("    preloaded rows %d..%d of %d (%s)", c[0], c[1], p.Rows, time.Since(t0).Round(time.Second))
	}
	res.Seconds = time.Since(t0).Seconds()
	t1 := time.Now()
	for _, tb := range []string{t.Txlog, t.Outbox, t.ConsumeLog, t.Attempt} {
		q := "ANALYZE TABLE " + tb
		if engine == enginePostgres {
			q = "ANALYZE " + tb
		}
		if _, err := db.ExecContext(ctx, q); err != nil {
			return res, fmt.Errorf("analyze %s: %w", tb, err)
		}
	}
	res.Analyze = time.Since(t1).Seconds()
	return res, nil
}
