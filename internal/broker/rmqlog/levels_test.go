package rmqlog_test

import (
	"errors"
	"testing"

	rmqerrors "github.com/apache/rocketmq-client-go/v2/errors"
	"github.com/apache/rocketmq-client-go/v2/rlog"
	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/require"
)

// TestMissingTopicLinesAtDebug feeds the adapter the lines the client
// repeats, every rebalance and route refresh, for a consumer whose topic
// does not exist yet (consumer.Start allows it and reports the topic
// itself): they arrive at Debug. The same route lines for a name server
// that cannot be reached keep their level.
func TestMissingTopicLinesAtDebug(t *testing.T) {
	_, hook := capture(t)
	cases := []struct {
		name string
		log  func()
		want logrus.Level
	}{
		{"rebalance on a missing topic", func() {
			rlog.Warning("do balance in group failed, the topic does not exist", map[string]interface{}{
				rlog.LogKeyConsumerGroup: "points", rlog.LogKeyTopic: "payments"})
		}, logrus.DebugLevel},
		{"route of a missing topic", func() {
			rlog.Warning("query topic route from server error", map[string]interface{}{
				rlog.LogKeyUnderlayError: rmqerrors.ErrTopicNotExist})
		}, logrus.DebugLevel},
		{"no route data", func() {
			rlog.Warning("queryTopicRouteInfoFromServer return nil", map[string]interface{}{rlog.LogKeyTopic: "payments"})
		}, logrus.DebugLevel},
		{"started before subscribing", func() {
			rlog.Warning("not subscribe any topic yet", map[string]interface{}{rlog.LogKeyConsumerGroup: "points"})
		}, logrus.DebugLevel},
		{"route query failed otherwise", func() {
			rlog.Warning("query topic route from server error", map[string]interface{}{
				rlog.LogKeyUnderlayError: errors.New("connection refused")})
		}, logrus.WarnLevel},
		{"rebalance without consumer ids", func() {
			rlog.Warning("do balance in group failed, get consumer id list failed", map[string]interface{}{
				rlog.LogKeyConsumerGroup: "points", rlog.LogKeyTopic: "payments"})
		}, logrus.WarnLevel},
	}
	for _, c := range cases {
		hook.Reset()
		c.log()
		entries := hook.AllEntries()
		require.Len(t, entries, 1, c.name)
		require.Equal(t, c.want, entries[0].Level, c.name)
	}
}
