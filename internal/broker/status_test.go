package broker_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/errclass"
	"github.com/rmqtx/rmqtx/internal/broker"
)

// The one reading of a send's answer: every status the client reports, no
// result at all, and a failed call, as each sender (consumer re-send,
// discard republish, replay, outbox sink, send spans) relies on it.
func TestCheckSendResultReadsEveryAnswer(t *testing.T) {
	cases := []struct {
		name    string
		res     *broker.SendResult
		answer  string // StatusError's answer name; "" for none
		class   errclass.Class
		text    string
		outcome string // SendOutcome with no call error
	}{
		{"ok", &broker.SendResult{Status: broker.SendOK, MsgID: "m"}, "", "", "", ""},
		{"flush disk", &broker.SendResult{Status: broker.SendFlushDiskTimeout}, "flush_disk_timeout", errclass.Unknown, "send status 1 (flush_disk_timeout)", "send_status"},
		{"flush slave", &broker.SendResult{Status: broker.SendFlushSlaveTimeout}, "flush_slave_timeout", errclass.Unknown, "send status 2 (flush_slave_timeout)", "send_status"},
		{"slave missing", &broker.SendResult{Status: broker.SendSlaveNotAvailable}, "slave_not_available", errclass.Unknown, "send status 3 (slave_not_available)", "send_status"},
		{"unknown status", &broker.SendResult{Status: 42}, "send_status_42", errclass.Unknown, "send status 42 (send_status_42)", "send_status"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := broker.CheckSendResult(c.res)
			require.Equal(t, c.outcome, broker.SendOutcome(c.res, nil))
			require.Equal(t, "send", broker.SendOutcome(c.res, errors.New("refused")), "a failed call is a failed send whatever the result")
			if c.answer == "" {
				require.NoError(t, err)
				return
			}
			var se *broker.StatusError
			require.ErrorAs(t, err, &se)
			require.Equal(t, c.res.Status, se.Status)
			require.Equal(t, c.answer, se.Answer.Name)
			require.Equal(t, c.class, se.Answer.Class)
			require.EqualError(t, err, c.text)
			require.NotErrorIs(t, err, broker.ErrNoSendResult)
		})
	}
	// No result and no error: never read as a success.
	err := broker.CheckSendResult(nil)
	require.ErrorIs(t, err, broker.ErrNoSendResult)
	var se *broker.StatusError
	require.False(t, errors.As(err, &se))
	require.Equal(t, "send", broker.SendOutcome(nil, nil))
}
