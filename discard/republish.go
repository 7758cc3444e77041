package discard

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/rmqmsg"
	"github.com/rmqtx/rmqtx/txlog"
	"github.com/rmqtx/rmqtx/wire"
)

// Topic is where the broker moves a half message after transactionCheckMax
// checks (TopicValidator.RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC). The broker
// creates it (1 queue, read/write) on the first discard; the message keeps
// its body, sysflag and every property (REAL_TOPIC, PGROUP, UNIQ_KEY, our
// envelope), and is consumable like any other message.
const Topic = "TRANS_CHECK_MAX_TIME_TOPIC"

// stripped are properties that must never be carried onto a republished
// message: transaction markers, broker bookkeeping and retry bookkeeping.
// The republished message is built from the txlog row (RepublishMessage);
// the row's stored properties are filtered through this list too, so a
// stray system property in them cannot turn the republish into something
// else.
var stripped = map[string]bool{
	broker.PropTransactionPrepared:  true,
	broker.PropProducerGroup:        true,
	broker.PropRealTopic:            true,
	broker.PropRealQueueID:          true,
	broker.PropTransactionID:        true,
	broker.PropCheckTimes:           true,
	broker.PropCheckImmunitySeconds: true,
	broker.PropPreparedQueueOffset:  true,
	broker.PropMinOffset:            true,
	broker.PropMaxOffset:            true,
	broker.PropRetryTopic:           true,
	broker.PropOriginMessageID:      true,
	broker.PropReconsumeTime:        true,
	broker.PropMaxReconsumeTimes:    true,
	broker.PropConsumeStartTime:     true,
	broker.PropDelayTimeLevel:       true,
	broker.PropTimerDeliverMS:       true,
	broker.PropCluster:              true,
	broker.PropMsgRegion:            true,
	broker.PropTraceSwitch:          true,
}

// RepublishProperties returns the properties to put on the normal message
// that replaces a discarded half message.
func RepublishProperties(props map[string]string) map[string]string {
	out := make(map[string]string, len(props))
	for k, v := range props {
		if !stripped[k] {
			out[k] = v
		}
	}
	return out
}

// RepublishMessage builds the normal message that replaces a discarded half
// message, from the txlog row alone: topic, tags, keys, stored properties
// (the envelope, and the UNIQ_KEY of the half that committed) and payload,
// with the envelope's routing key as sharding key (wire.RoutingKey): the
// Recovery's publisher sends it to the queue wire.QueueFor picks, the queue
// of the aggregate's other events.
// Nothing is taken from the discarded message, whose REAL_TOPIC the broker
// rewrites when it passes through a retry. It returns an error wrapping
// ErrNotRepublishable when the row lacks what a republish needs.
func RepublishMessage(row txlog.Row) (*rmqmsg.Message, error) {
	if reason := notRepublishable(row); reason != "" {
		return nil, fmt.Errorf("%w: %s: %s", ErrNotRepublishable, row.EventID, reason)
	}
	props := map[string]string{}
	if row.Properties != "" {
		_ = json.Unmarshal([]byte(row.Properties), &props) // notRepublishable checked it
	}
	props = RepublishProperties(props)
	// The columns win over their copies in the stored properties.
	props[wire.PropEventID] = row.EventID
	for k, v := range map[string]string{wire.PropEventType: row.EventType, wire.PropBusinessKey: row.BusinessKey,
		wire.PropPayloadHash: row.PayloadHash} {
		if v != "" {
			props[k] = v
		}
	}
	// The queue: the routing key of the row's aggregate (else business
	// key), as txproducer.Send chose it, so the republished event joins its
	// aggregate's queue (WIRE.md, "Queue routing"). A stored sharding key is
	// replaced by the one the envelope gives.
	delete(props, broker.PropShardingKey)
	if k := wire.PropertiesRoutingKey(props); k != "" {
		props[broker.PropShardingKey] = k
	}
	msg := broker.NewMessage(row.Topic, row.Payload)
	msg.WithProperties(props) // replaces the map: tags and keys after it
	if row.Tags != "" {
		msg.WithTag(row.Tags)
	}
	if keys := strings.Fields(row.Keys); len(keys) > 0 {
		msg.WithKeys(keys)
	}
	return msg, nil
}

// ErrNotRepublishable is wrapped when a COMMITTED txlog row cannot be
// published again from the log (see txlog.RecoveryNoPayload).
var ErrNotRepublishable = errors.New("discard: committed row cannot be republished from the txlog")

// notRepublishable says why row cannot be republished, or "".
func notRepublishable(row txlog.Row) string {
	switch {
	case row.Topic == "":
		return "the row has no topic"
	case len(row.Payload) == 0 && row.PayloadHash != wire.Hash(nil):
		return "no payload stored (payload storage disabled, or a resolver's decision)"
	case row.PayloadHash != "" && wire.Hash(row.Payload) != row.PayloadHash:
		return "the stored payload does not match its hash"
	case row.Properties != "" && json.Unmarshal([]byte(row.Properties), &map[string]string{}) != nil:
		return "the stored properties are not a JSON object of strings"
	}
	return ""
}
