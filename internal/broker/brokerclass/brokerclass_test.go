package brokerclass

import (
	"errors"
	"fmt"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/errclass"
)

// TestEveryCode pins the class of each broker answer, read from the three
// shapes the client reports a refusal in.
func TestEveryCode(t *testing.T) {
	want := map[int]struct {
		name     string
		class    errclass.Class
		operator bool
	}{
		1:  {"system_error", errclass.Transient, false},
		2:  {"system_busy", errclass.Transient, false},
		10: {"flush_disk_timeout", errclass.Unknown, false},
		11: {"slave_not_available", errclass.Unknown, false},
		12: {"flush_slave_timeout", errclass.Unknown, false},
		13: {"message_illegal", errclass.Permanent, false},
		14: {"service_not_available", errclass.Transient, false},
		16: {"no_permission", errclass.Permanent, false},
		17: {"topic_not_exist", errclass.Transient, true},
	}
	require.Len(t, Codes(), len(want))
	for _, code := range Codes() {
		w, ok := want[code]
		require.True(t, ok, "code %d", code)
		for _, err := range []error{
			primitive.MQBrokerErr{ResponseCode: int16(code), ErrorMessage: "x"},
			fmt.Errorf("wrapped: %w", &primitive.MQBrokerErr{ResponseCode: int16(code), ErrorMessage: "x"}),
			fmt.Errorf("send: %w", fmt.Errorf("CODE: %d, DESC: x", code)),
			primitive.NewMQClientErr(int16(code), "x"),
		} {
			a, ok := OfError(err)
			require.True(t, ok, "%v", err)
			require.Equal(t, Answer{Code: code, Name: w.name, Class: w.class, Operator: w.operator}, a, "%v", err)
		}
	}
}

func TestUnknownCodeAndNoCode(t *testing.T) {
	a := OfCode(215)
	require.Equal(t, errclass.Transient, a.Class)
	require.Equal(t, "broker_code_215", a.Name)
	_, ok := OfError(errors.New("dial tcp 127.0.0.1:1: connect: connection refused"))
	require.False(t, ok)
	_, ok = OfError(nil)
	require.False(t, ok)
	require.Equal(t, "", Describe(errors.New("timeout")))
	require.Contains(t, Describe(fmt.Errorf("CODE: 17  DESC: topic[x] not exist")), "topic_not_exist: the topic does not exist")
}

func TestStatuses(t *testing.T) {
	_, ok := OfStatus(primitive.SendOK)
	require.False(t, ok)
	for s, code := range map[primitive.SendStatus]int{
		primitive.SendFlushDiskTimeout: FlushDiskTimeout, primitive.SendFlushSlaveTimeout: FlushSlaveTimeout,
		primitive.SendSlaveNotAvailable: SlaveNotAvailable,
	} {
		a, ok := OfStatus(s)
		require.True(t, ok)
		require.Equal(t, OfCode(code), a)
	}
	a, ok := OfStatus(primitive.SendUnknownError)
	require.True(t, ok)
	require.Equal(t, errclass.Unknown, a.Class)
}
