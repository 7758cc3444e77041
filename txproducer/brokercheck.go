package txproducer

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/rmqtx/rmqtx/internal/remoting"
)

// checkBrokerSettings compares FenceAge with the transaction-check settings
// of every master broker (see Config.FenceAge). It fails only for a
// violation with recovery disabled; a broker it cannot read is logged and
// skipped, because an unreadable admin request (ACL, proxy) must not stop
// a producer from starting.
func (p *Producer) checkBrokerSettings(ctx context.Context) error {
	l := p.cfg.Logger
	masters, err := remoting.ClusterMasters(ctx, p.cfg.NameServers, p.cfg.SendTimeout)
	if err != nil {
		l.WithError(err).Info("txproducer: could not list the brokers; FenceAge not checked against their settings")
		return nil
	}
	for _, addr := range masters {
		conf, err := remoting.BrokerConfig(ctx, addr, p.cfg.SendTimeout)
		if err != nil {
			l.WithError(err).WithField("broker", addr).Info("txproducer: could not read the broker's settings; FenceAge not checked against them")
			continue
		}
		e, err := fenceAgeAgainst(addr, p.cfg.FenceAge, conf)
		if err != nil {
			l.WithError(err).WithField("broker", addr).Info("txproducer: broker settings incomplete; FenceAge not checked against them")
			continue
		}
		if e == nil {
			continue
		}
		if p.cfg.DisableRecovery {
			return e
		}
		l.WithField("broker", addr).Warn(e.Error() + "; discard recovery will resolve those halves from the txlog")
	}
	return nil
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
