package txproducer

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/rmqtx/rmqtx/internal/broker/remoting"
)

// checkBrokerSettings compares FenceAge with the transaction-check settings
// of every master broker (see Config.FenceAge), and warns about a broker
// whose op batching makes it re-check answered halves (warnOpBatch) and
// about one that can lose acknowledged messages in a power loss
// (warnDurability). It
// fails only for a FenceAge violation with recovery disabled, naming every
// broker that FenceAge does not fit (one refusal per broker, so that one
// restart after fixing them suffices); with recovery it warns once per such
// broker. A broker it cannot read is logged and skipped, because an
// unreadable admin request (ACL, proxy) must not stop a producer from
// starting. It returns the masters it listed (nil when the name server did
// not answer).
func (p *Producer) checkBrokerSettings(ctx context.Context) ([]string, error) {
	l := p.cfg.Logger
	masters, err := remoting.ClusterMasters(ctx, p.cfg.NameServers, p.cfg.SendTimeout)
	if err != nil {
		l.WithError(err).Info("txproducer: could not list the brokers; FenceAge not checked against their settings")
		return nil, nil
	}
	var refused brokerSettingsErrors
	for _, addr := range masters {
		conf, err := remoting.BrokerConfig(ctx, addr, p.cfg.SendTimeout)
		if err != nil {
			l.WithError(err).WithField("broker", addr).Info("txproducer: could not read the broker's settings; FenceAge not checked against them")
			continue
		}
		warnOpBatch(l, addr, conf)
		warnDurability(l, addr, conf)
		warnFailover(l, addr, conf, p.cfg.SendTimeout)
		e, err := fenceAgeAgainst(addr, p.cfg.FenceAge, conf)
		if err != nil {
			l.WithError(err).WithField("broker", addr).Info("txproducer: broker settings incomplete; FenceAge not checked against them")
			continue
		}
		if e == nil {
			continue
		}
		if p.cfg.DisableRecovery {
			refused = append(refused, e)
			continue
		}
		l.WithField("broker", addr).Warn(e.Error() + "; discard recovery will resolve those halves from the txlog")
	}
	switch len(refused) {
	case 0:
		return masters, nil
	case 1:
		return masters, refused[0]
	}
	return masters, refused
}

// brokerSettingsErrors is Start's refusal when FenceAge does not fit several
// brokers' settings: one *BrokerSettingsError per broker, in the name
// server's order. errors.As finds the first, errors.Is(err, ErrConfig)
// holds.
type brokerSettingsErrors []*BrokerSettingsError

func (es brokerSettingsErrors) Error() string {
	msgs := make([]string, len(es))
	for i, e := range es {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "; ")
}

func (es brokerSettingsErrors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// defaultOpBatchInterval is the broker's transactionOpBatchInterval when its
// configuration does not list the key (the RocketMQ 5.x default).
const defaultOpBatchInterval = 3000 * time.Millisecond

// warnOpBatch warns when the broker at addr checks halves no later than it
// writes the "done" (op) records of answered ones. The broker writes those
// records in batches, every transactionOpBatchInterval; a check that runs
// before the batch of an answered half sees no record, so it checks that
// half again, stores the event once more for each COMMIT answer, and after
// transactionCheckMax such checks discards it, and recovery republishes it.
// Measured under a broker kill with transactionTimeOut 1000 ms and the
// default 3000 ms interval: more than half of the committed events were
// stored 2 to 5 times. Consumers dedup the copies, but broker and consumer
// work multiplies. Nothing is logged when the settings cannot be read.
func warnOpBatch(l logrus.FieldLogger, addr string, conf map[string]string) {
	timeout, batch, ok := opBatchAgainst(conf)
	if !ok || timeout > batch {
		return
	}
	l.WithFields(logrus.Fields{
		"broker": addr, "transactionTimeOut": timeout.Milliseconds(), "transactionOpBatchInterval": batch.Milliseconds(),
	}).Warnf("txproducer: broker %s: transactionTimeOut %d ms <= transactionOpBatchInterval %d ms: the broker checks halves "+
		"that were already answered, stores a committed event again for each COMMIT answer, and discards some for recovery to "+
		"republish; consumers dedup the copies but their work multiplies. Set transactionOpBatchInterval below transactionTimeOut "+
		"(or raise transactionTimeOut)", addr, timeout.Milliseconds(), batch.Milliseconds())
}

// opBatchAgainst reads transactionTimeOut and transactionOpBatchInterval
// (default 3000 ms when absent) from a broker configuration; ok is false
// when transactionTimeOut, or a present interval, is not a number.
func opBatchAgainst(conf map[string]string) (timeout, batch time.Duration, ok bool) {
	ms := func(v string) (time.Duration, bool) {
		n, err := strconv.ParseInt(v, 10, 64)
		return time.Duration(n) * time.Millisecond, err == nil && n >= 0
	}
	timeout, ok = ms(conf["transactionTimeOut"])
	if !ok {
		return 0, 0, false
	}
	batch = defaultOpBatchInterval
	if v, present := conf["transactionOpBatchInterval"]; present {
		if batch, ok = ms(v); !ok {
			return 0, 0, false
		}
	}
	return timeout, batch, true
}

// fenceAgeAgainst returns a *BrokerSettingsError when fenceAge does not fit
// the broker configuration conf, nil when it does, and an error when conf
// lacks a setting.
func fenceAgeAgainst(addr string, fenceAge time.Duration, conf map[string]string) (*BrokerSettingsError, error) {
	num := func(key string) (int64, error) {
		v, err := strconv.ParseInt(conf[key], 10, 64)
		if err != nil || v < 0 {
			return 0, fmt.Errorf("txproducer: broker %s: %s = %q", addr, key, conf[key])
		}
		return v, nil
	}
	timeout, err := num("transactionTimeOut")
	if err != nil {
		return nil, err
	}
	interval, err := num("transactionCheckInterval")
	if err != nil {
		return nil, err
	}
	checkMax, err := num("transactionCheckMax")
	if err != nil {
		return nil, err
	}
	e := &BrokerSettingsError{Broker: addr, FenceAge: fenceAge, TransactionTimeOut: time.Duration(timeout) * time.Millisecond,
		CheckInterval: time.Duration(interval) * time.Millisecond, CheckMax: int(checkMax)}
	if fenceAge < e.MaxFenceAge() {
		return nil, nil
	}
	return e, nil
}

// warnDurability warns when the broker at addr acknowledges a message that
// is neither on its disk nor on a second machine: flushDiskType ASYNC_FLUSH
// (the commit log reaches the disk up to a flush interval later) on a
// broker that is not a SYNC_MASTER (which waits for its slave to have the
// message) and does not replicate its commit log through DLedger (which
// waits for a majority). A kill -9 leaves such a message in the page cache,
// where the restarted broker finds it; a power loss or kernel crash loses
// it, after the producer has committed the local transaction and answered
// COMMIT: the event is then gone although its txlog row says COMMITTED
// (invariant I1 holds only as long as the broker's store does). The README's
// production section lists the broker and database settings I1 needs.
//
// It is a warning, not a refusal: test beds and many deployments run
// ASYNC_FLUSH on purpose, and a SYNC_MASTER's slave may attach after Start.
// A SYNC_MASTER without a connected slave is not detected here (the broker
// answers such sends with SLAVE_NOT_AVAILABLE). Nothing is logged when
// flushDiskType cannot be read.
func warnDurability(l logrus.FieldLogger, addr string, conf map[string]string) {
	flush, role, durable, ok := durabilityOf(conf)
	if !ok || durable {
		return
	}
	l.WithFields(logrus.Fields{"broker": addr, "flushDiskType": flush, "brokerRole": role}).Warnf(
		"txproducer: broker %s: flushDiskType %s and brokerRole %s: the broker acknowledges messages it has neither "+
			"flushed to disk nor copied to a synchronous slave, so a power loss or OS crash of its machine can lose "+
			"committed events (a process kill cannot). For durable events set flushDiskType=SYNC_FLUSH, or run it as a "+
			"SYNC_MASTER with a slave (on a development broker this is expected)", addr, flush, role)
}

// durabilityOf reads flushDiskType and brokerRole from a broker
// configuration. durable is true when an acknowledged message survives a
// power loss of the broker's machine: SYNC_FLUSH, a SYNC_MASTER, or a
// DLedger commit log (enableDLegerCommitLog=true). ok is false when
// flushDiskType is absent or not one of the broker's two values.
func durabilityOf(conf map[string]string) (flush, role string, durable, ok bool) {
	flush, role = strings.TrimSpace(conf["flushDiskType"]), strings.TrimSpace(conf["brokerRole"])
	switch flush {
	case "SYNC_FLUSH":
		return flush, role, true, true
	case "ASYNC_FLUSH":
	default:
		return flush, role, false, false
	}
	if role == "" {
		role = "ASYNC_MASTER" // the broker's default
	}
	durable = role == "SYNC_MASTER" || strings.EqualFold(strings.TrimSpace(conf["enableDLegerCommitLog"]), "true")
	return flush, role, durable, true
}

// warnFailover warns, naming the broker, about replication settings under
// which a failover loses acknowledged messages or a stuck slave is not
// reported clearly:
//   - controller mode (enableControllerMode=true) without
//     allAckInSyncStateSet=true: the master acknowledges a put before every
//     in-sync replica has it, and the replica promoted after the master's
//     death truncates what it lacks, committed events included;
//   - controller mode with enableElectUncleanMaster=true: a replica outside
//     the sync state set may be elected, with the same loss;
//   - a synchronous master (SYNC_MASTER, or controller mode, where the
//     elected master is one) whose slaveTimeout is not below the
//     producer's SendTimeout: while a slave stops answering, the client
//     times out first and sends the half again, so the broker stores
//     copies and the Send fails as a plain timeout; with slaveTimeout below
//     it the broker answers FLUSH_SLAVE_TIMEOUT first and Send fails at
//     once with ErrForcedRollback (nothing committed). Logged at Info: it
//     loses nothing.
//
// Nothing is logged for a setting the configuration does not carry.
func warnFailover(l logrus.FieldLogger, addr string, conf map[string]string, sendTimeout time.Duration) {
	is := func(k string) bool { return strings.EqualFold(strings.TrimSpace(conf[k]), "true") }
	isNot := func(k string) bool { return strings.EqualFold(strings.TrimSpace(conf[k]), "false") }
	controller := is("enableControllerMode")
	if controller && isNot("allAckInSyncStateSet") {
		l.WithFields(logrus.Fields{"broker": addr, "allAckInSyncStateSet": false}).Warnf(
			"txproducer: broker %s: controller mode with allAckInSyncStateSet=false: it acknowledges puts its slave may not "+
				"have, and the slave promoted after this master dies truncates them, committed events included; set "+
				"allAckInSyncStateSet=true", addr)
	}
	if controller && is("enableElectUncleanMaster") {
		l.WithFields(logrus.Fields{"broker": addr, "enableElectUncleanMaster": true}).Warnf(
			"txproducer: broker %s: enableElectUncleanMaster=true lets the controller promote a replica that lacks "+
				"acknowledged messages, committed events included; set it to false", addr)
	}
	if !controller && strings.TrimSpace(conf["brokerRole"]) != "SYNC_MASTER" {
		return
	}
	ms, err := strconv.Atoi(strings.TrimSpace(conf["slaveTimeout"]))
	if err != nil || time.Duration(ms)*time.Millisecond < sendTimeout {
		return
	}
	l.WithFields(logrus.Fields{"broker": addr, "slaveTimeout_ms": ms, "send_timeout": sendTimeout.String()}).Infof(
		"txproducer: broker %s: slaveTimeout %d ms is not below SendTimeout %s: while its slave stops answering, "+
			"Sends time out and the client sends their halves again (extra stored copies) instead of failing at once "+
			"with ErrForcedRollback; set slaveTimeout below SendTimeout", addr, ms, sendTimeout)
}
