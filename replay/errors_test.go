package replay

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rmqtx/rmqtx/errclass"
	"github.com/rmqtx/rmqtx/internal/broker"
	"github.com/rmqtx/rmqtx/internal/broker/brokerclass"
	"github.com/rmqtx/rmqtx/outbox"
)

// TestSendFailureClass: a failed replay send is classified with the shared
// vocabulary; an error nobody classified is Unknown (errclass's fallback,
// kept on purpose: a replay does not retry by itself).
func TestSendFailureClass(t *testing.T) {
	t.Parallel()
	cases := []struct {
		err   error
		class errclass.Class
		code  string
	}{
		{errors.New("CODE: 17  DESC: topic[x] not exist, apply first please!"), errclass.Transient, "topic_not_exist"},
		{fmt.Errorf("send: %w", errors.New("CODE: 13  DESC: the message body size over max value")), errclass.Permanent, "message_illegal"},
		{&broker.StatusError{Status: broker.SendFlushDiskTimeout, Answer: mustStatus(t, broker.SendFlushDiskTimeout)}, errclass.Unknown, "flush_disk_timeout"},
		{broker.ErrNoSendResult, errclass.Unknown, "no_result"},
		{fmt.Errorf("send: %w", context.DeadlineExceeded), errclass.Unknown, "timeout"},
		{outbox.NewSendError(outbox.ClassPermanent, "custom", errors.New("x")), errclass.Permanent, "custom"},
		{errors.New("connection refused"), errclass.Unknown, "unknown"},
	}
	for _, c := range cases {
		f := sendFailure(c.err)
		require.Equal(t, c.class, f.Class, c.err.Error())
		require.Equal(t, c.code, f.ErrorCode(), c.err.Error())
		require.ErrorIs(t, f, c.err)
		require.Equal(t, c.err.Error(), f.Error(), "the text is the send's")
	}
}

func mustStatus(t *testing.T, s broker.SendStatus) brokerclass.Answer {
	t.Helper()
	a, failed := brokerclass.OfStatus(s)
	require.True(t, failed)
	return a
}
