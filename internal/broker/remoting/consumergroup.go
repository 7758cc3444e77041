package remoting

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Request codes of a consumer group's broker-side state.
const (
	ReqQueryConsumerOffset    = 14
	ReqGetMaxOffset           = 30
	ReqGetConsumerListByGroup = 38
)

// ConsumerIDs returns the client ids of group's consumers that the broker at
// addr counts, sorted: the list every consumer of the group allocates queues
// by when it rebalances. None when the broker knows no consumer of it.
func ConsumerIDs(ctx context.Context, addr string, timeout time.Duration, group string) ([]string, error) {
	h, body, err := RoundTrip(ctx, addr, timeout, ReqGetConsumerListByGroup, map[string]string{"consumerGroup": group})
	if err != nil {
		return nil, err
	}
	if h.Code != ResSuccess {
		if strings.Contains(h.Remark, "no consumer") {
			return nil, nil
		}
		return nil, fmt.Errorf("remoting: consumers of %s on %s: code %d: %s", group, addr, h.Code, h.Remark)
	}
	var l struct {
		ConsumerIDList []string `json:"consumerIdList"`
	}
	if err := decodeJSON(body, &l); err != nil {
		return nil, fmt.Errorf("remoting: decode consumers of %s from %s: %w", group, addr, err)
	}
	sort.Strings(l.ConsumerIDList)
	return l.ConsumerIDList, nil
}

// ConsumerOffset returns group's committed offset of one queue of topic on
// the broker at addr; found is false when the group has committed none.
func ConsumerOffset(ctx context.Context, addr string, timeout time.Duration, group, topic string, queue int) (offset int64, found bool, err error) {
	h, _, err := RoundTrip(ctx, addr, timeout, ReqQueryConsumerOffset, map[string]string{
		"consumerGroup": group, "topic": topic, "queueId": strconv.Itoa(queue), "setZeroIfNotFound": "false",
	})
	if err != nil {
		return 0, false, err
	}
	if h.Code == ResQueryNotFound {
		return 0, false, nil
	}
	offset, err = offsetOf(h, "offset of "+group+" on "+addr)
	return offset, err == nil, err
}

// MaxOffset returns the offset after the last message of one queue of topic
// on the broker at addr.
func MaxOffset(ctx context.Context, addr string, timeout time.Duration, topic string, queue int) (int64, error) {
	h, _, err := RoundTrip(ctx, addr, timeout, ReqGetMaxOffset, map[string]string{"topic": topic, "queueId": strconv.Itoa(queue)})
	if err != nil {
		return 0, err
	}
	return offsetOf(h, "max offset of "+topic+" on "+addr)
}

// offsetOf reads the "offset" field of a successful answer; what names the
// request in errors.
func offsetOf(h Header, what string) (int64, error) {
	if h.Code != ResSuccess {
		return 0, fmt.Errorf("remoting: %s: code %d: %s", what, h.Code, h.Remark)
	}
	offset, err := strconv.ParseInt(h.ExtFields["offset"], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("remoting: %s: %w", what, err)
	}
	return offset, nil
}
