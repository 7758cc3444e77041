package rmqlog

import (
	"errors"

	rmqerrors "github.com/apache/rocketmq-client-go/v2/errors"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/rlog"
	"github.com/sirupsen/logrus"
)

// leveller decides the level of one of the client's known lines from its
// fields; it returns the level the client chose when the line is not an
// ordinary outcome.
type leveller func(client logrus.Level, fields map[string]interface{}) logrus.Level

// known holds the client's lines that report an ordinary outcome at a
// level meant for faults. Log-based alerts fire on ERROR, and the client
// logs every rolled-back local transaction at ERROR, so an ordinary "out of
// stock" (or a duplicate Send, answered ROLLBACK by design) would page
// someone. rmqtx reports those outcomes itself, through Send's result and
// its own metrics, so the client's line is only a trace of them: Debug.
// Everything not listed here keeps the client's level.
var known = map[string]leveller{
	// producer.SendMessageInTransaction, after the local transaction: the
	// listener answered anything but COMMIT. ROLLBACK is an ordinary
	// outcome (the caller's function failed, or a duplicate id). UNKNOWN is
	// what txproducer answers for every commit it ends itself (a keyed
	// Send, see txproducer's endsync.go), and otherwise means rmqtx could
	// not learn or persist its own outcome, which it logs itself.
	"executeLocalTransaction but state unexpected": func(client logrus.Level, f map[string]interface{}) logrus.Level {
		switch localState(f["localState"]) {
		case primitive.RollbackMessageState, primitive.UnkonwnState:
			return logrus.DebugLevel
		}
		return client
	},
	// A consumer started before its topic exists (consumer.Start allows it
	// and logs the missing topic itself, once, then every 5 minutes): the
	// client repeats these on every rebalance (20 s) and route refresh
	// (30 s) until the topic is created.
	"do balance in group failed, the topic does not exist": debug,
	"not subscribe any topic yet":                          debug, // consumer.Start subscribes such a topic right after the client's Start
	"queryTopicRouteInfoFromServer return nil":             debug, // follows "query topic route from server error" or "connect to namesrv failed.", which keep their level
	"query topic route from server error": func(client logrus.Level, f map[string]interface{}) logrus.Level {
		if err, ok := f[rlog.LogKeyUnderlayError].(error); ok && errors.Is(err, rmqerrors.ErrTopicNotExist) {
			return logrus.DebugLevel
		}
		return client
	},
}

// debug demotes a line to Debug whatever the client's level.
func debug(logrus.Level, map[string]interface{}) logrus.Level { return logrus.DebugLevel }

// localState reads the client's localState field, whatever integer type
// carries it.
func localState(v interface{}) primitive.LocalTransactionState {
	switch s := v.(type) {
	case primitive.LocalTransactionState:
		return s
	case int:
		return primitive.LocalTransactionState(s)
	}
	return 0
}

// levelOf returns the level a client line is forwarded at.
func levelOf(client logrus.Level, msg string, f map[string]interface{}) logrus.Level {
	if l, ok := known[msg]; ok {
		return l(client, f)
	}
	return client
}
