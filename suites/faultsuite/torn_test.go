//go:build failpoints

package faultsuite

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/internal/broker/remoting"
	"github.com/rmqtx/rmqtx/internal/testenv"
	"github.com/rmqtx/rmqtx/suites/internal/testbed"
	"github.com/rmqtx/rmqtx/wire"
)

// commitLogFileSize is mappedFileSizeCommitLog in scripts/rocketmq/broker.conf.
const commitLogFileSize = 64 << 20

// PULL_MESSAGE and its "the request carries the subscription" flag.
const (
	reqPullMessage       = 11
	pullFlagSubscription = 0x4
)

// tornTail is how many bytes at the end of the torn record are zeroed: more
// than the broker's CRC property (20 bytes), well short of the body.
const tornTail = 40

// TestTornRecordIsDropped reproduces what a SIGKILL can leave in the broker's
// commit log: a record whose first bytes (length, magic, body and its CRC)
// were copied into the mapped file and whose last bytes (the end of the
// properties) were not. The broker's default recovery checks the body's CRC
// only, so it keeps such a record and consumers receive a message whose
// properties are cut short: no rmqtx event id, a message rmqtx never sent.
// The test bed's broker appends a CRC of the whole record and verifies it on
// recovery (enabledAppendPropCRC, forceVerifyPropCRC in broker.conf), so the
// torn record is truncated away. The tear is written into the store file
// while the broker is down, then the broker recovers as after any kill -9.
func TestTornRecordIsDropped(t *testing.T) {
	env := testenv.Integration(t)
	private := suite.Private(t)
	suite.KeepUp(t, "broker")
	topic := testenv.Name(t, "topic")
	testenv.CreateTopic(t, topic, 1)
	ctx := context.Background()

	send := func(p rocketmq.Producer, id string) *primitive.SendResult {
		t.Helper()
		m := primitive.NewMessage(topic, []byte(`{"order":"`+id+`"}`))
		m.WithProperty(wire.PropEventID, id)
		m.WithProperty(wire.PropEventType, testbed.EventType)
		m.WithProperty("suite", "faultsuite torn record")
		var res *primitive.SendResult
		testenv.Eventually(t, 60*time.Second, "a stored send of "+id, func() bool {
			r, err := p.SendSync(ctx, m)
			if err == nil && r.Status == primitive.SendOK {
				res = r
				return true
			}
			return false
		})
		return res
	}
	before, torn := wire.NewEventID(), wire.NewEventID()
	p := testenv.Producer(t)
	send(p, before)
	res := send(p, torn)
	off, err := physicalOffset(res.OffsetMsgID)
	require.NoError(t, err)

	suite.MustService(t, "kill9", "broker")
	file := filepath.Join(private.RunDir(), "rocketmq", "store", "commitlog", fmt.Sprintf("%020d", off/commitLogFileSize*commitLogFileSize))
	f, err := os.OpenFile(file, os.O_RDWR, 0)
	require.NoError(t, err)
	var size [4]byte
	_, err = f.ReadAt(size[:], off%commitLogFileSize)
	require.NoError(t, err)
	total := int64(binary.BigEndian.Uint32(size[:]))
	require.Greater(t, total, int64(3*tornTail), "the stored record of the torn message (%d bytes at %d)", total, off)
	_, err = f.WriteAt(make([]byte, tornTail), off%commitLogFileSize+total-tornTail)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	suite.MustComeBack(t, "broker")

	// Read the queue back from offset 0 with one raw PULL_MESSAGE request:
	// exactly what the broker serves after recovery, in order. (Not the
	// client's pull consumer, whose PullFrom races with its own rebalance.)
	var got []*primitive.MessageExt
	testenv.Eventually(t, 60*time.Second, "a pull of the recovered queue", func() bool {
		h, body, err := remoting.RoundTrip(ctx, env.Broker, 5*time.Second, reqPullMessage, map[string]string{
			"consumerGroup": testenv.Name(t, "pull"), "topic": topic, "queueId": "0", "queueOffset": "0",
			"maxMsgNums": "32", "sysFlag": strconv.Itoa(pullFlagSubscription), "commitOffset": "0",
			"suspendTimeoutMillis": "0", "subscription": "*", "subVersion": strconv.FormatInt(time.Now().UnixMilli(), 10),
			"expressionType": "TAG",
		})
		if err != nil || h.Code != remoting.ResSuccess {
			return false
		}
		got = primitive.DecodeMessage(body)
		return true
	})
	var ids []string
	for _, m := range got {
		t.Logf("queue offset %d: %s", m.QueueOffset, testenv.Describe(m))
		ids = append(ids, m.GetProperty(wire.PropEventID))
	}
	require.Equal(t, []string{before}, ids, "after recovery the queue holds the intact record only; the torn one (%d bytes at %d) was truncated away", total, off)

	// The next send takes the torn record's slot.
	res2 := send(testenv.Producer(t), wire.NewEventID())
	require.Equal(t, int64(1), res2.QueueOffset, "the torn record's queue slot is reused")
}

// physicalOffset reads the commit log offset out of an offset message id:
// the store host's IPv4 address and port, then the offset (8 bytes).
func physicalOffset(offsetMsgID string) (int64, error) {
	b, err := hex.DecodeString(offsetMsgID)
	if err != nil || len(b) != 16 {
		return 0, fmt.Errorf("offset message id %q: not an IPv4 offset id", offsetMsgID)
	}
	v := binary.BigEndian.Uint64(b[8:])
	if v > 1<<62 {
		return 0, fmt.Errorf("offset message id %q: offset %d out of range", offsetMsgID, v)
	}
	return int64(v), nil
}
