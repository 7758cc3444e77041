// Package brokerclass is the one table that classifies a RocketMQ broker's
// answer to a send: its response code (the client reports a refusal as
// "CODE: <n>  DESC: <remark>") or the status of a stored message. The
// producer (txproducer.RetryAdvice), the outbox sink, replay and discard
// recovery all read it, so the same answer is handled the same way
// everywhere: a missing topic, say, is an operator's fix (create the topic),
// retried later, never a property of the event.
package brokerclass

import (
	"errors"
	"regexp"
	"strconv"

	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/rmqtx/rmqtx/errclass"
)

// Broker response codes (org.apache.rocketmq.remoting.protocol.ResponseCode).
const (
	SystemError         = 1
	SystemBusy          = 2
	FlushDiskTimeout    = 10
	SlaveNotAvailable   = 11
	FlushSlaveTimeout   = 12
	MessageIllegal      = 13
	ServiceNotAvailable = 14
	NoPermission        = 16
	TopicNotExist       = 17
)

// Answer is how one broker answer is handled.
type Answer struct {
	// Code is the broker's response code (0 for a send status the client
	// reported without one).
	Code int
	// Name is a short stable label: an outbox row's error code, a log
	// field, part of an error text.
	Name string
	// Class: Transient (nothing stored; sending again may succeed),
	// Unknown (stored, but not as durably as asked: a resend may duplicate,
	// which consumers dedup) or Permanent (the message itself is refused:
	// sending it again cannot succeed).
	Class errclass.Class
	// Operator: the answer is the cluster's setup (a topic that does not
	// exist), fixed by an operator and not by a different event. Its Class
	// is Transient: the outbox retries with backoff and logs the fix; the
	// producer advises against an automatic retry. NO_PERMISSION is
	// Permanent instead: it answers writes to a topic that can never be
	// written (a system topic, a read-only one), and sending again cannot
	// succeed until someone changes the topic, which the outbox row would
	// not survive waiting for.
	Operator bool
}

// Hint is what an operator reads about the answer, or "".
func (a Answer) Hint() string {
	switch a.Code {
	case TopicNotExist:
		return "the topic does not exist on the broker: create it (mqadmin updateTopic) or enable autoCreateTopicEnable"
	case NoPermission:
		return "the broker refuses writes to the topic: check the topic's and the broker's permission (a broker being shut down refuses writes too)"
	case MessageIllegal:
		return "the broker refuses the message itself (too large for maxMessageSize, or bad properties)"
	}
	return ""
}

var table = map[int]Answer{
	SystemError:         {SystemError, "system_error", errclass.Transient, false},
	SystemBusy:          {SystemBusy, "system_busy", errclass.Transient, false},
	FlushDiskTimeout:    {FlushDiskTimeout, "flush_disk_timeout", errclass.Unknown, false},
	SlaveNotAvailable:   {SlaveNotAvailable, "slave_not_available", errclass.Unknown, false},
	FlushSlaveTimeout:   {FlushSlaveTimeout, "flush_slave_timeout", errclass.Unknown, false},
	MessageIllegal:      {MessageIllegal, "message_illegal", errclass.Permanent, false},
	ServiceNotAvailable: {ServiceNotAvailable, "service_not_available", errclass.Transient, false},
	NoPermission:        {NoPermission, "no_permission", errclass.Permanent, false},
	TopicNotExist:       {TopicNotExist, "topic_not_exist", errclass.Transient, true},
}

// Codes lists the codes the table knows, for tests and documentation.
func Codes() []int {
	return []int{SystemError, SystemBusy, FlushDiskTimeout, SlaveNotAvailable, FlushSlaveTimeout,
		MessageIllegal, ServiceNotAvailable, NoPermission, TopicNotExist}
}

// OfCode returns the answer for a broker response code. A code the table
// does not know is Transient, named "broker_code_<n>".
func OfCode(code int) Answer {
	if a, ok := table[code]; ok {
		return a
	}
	return Answer{Code: code, Name: "broker_code_" + strconv.Itoa(code), Class: errclass.Transient}
}

var codeRE = regexp.MustCompile(`CODE: (\d+)`)

// CodeOf returns the broker response code err carries: a
// primitive.MQBrokerErr in its chain, or the client's "CODE: <n>" text.
func CodeOf(err error) (int, bool) {
	if err == nil {
		return 0, false
	}
	var be primitive.MQBrokerErr
	if errors.As(err, &be) {
		return int(be.ResponseCode), true
	}
	var bp *primitive.MQBrokerErr
	if errors.As(err, &bp) && bp != nil {
		return int(bp.ResponseCode), true
	}
	if sm := codeRE.FindStringSubmatch(err.Error()); sm != nil {
		if n, perr := strconv.Atoi(sm[1]); perr == nil {
			return n, true
		}
	}
	return 0, false
}

// OfError returns the answer of the broker code err carries, and false when
// it carries none (a network error, a timeout: the caller classifies those).
func OfError(err error) (Answer, bool) {
	code, ok := CodeOf(err)
	if !ok {
		return Answer{}, false
	}
	return OfCode(code), true
}

// OfStatus returns the answer for the status of a message the broker stored
// (the client turns codes 10, 11 and 12 into statuses), and false for
// SendOK.
func OfStatus(s primitive.SendStatus) (Answer, bool) {
	switch s {
	case primitive.SendOK:
		return Answer{}, false
	case primitive.SendFlushDiskTimeout:
		return table[FlushDiskTimeout], true
	case primitive.SendFlushSlaveTimeout:
		return table[FlushSlaveTimeout], true
	case primitive.SendSlaveNotAvailable:
		return table[SlaveNotAvailable], true
	}
	return Answer{Name: "send_status_" + strconv.Itoa(int(s)), Class: errclass.Unknown}, true
}

// Describe is "name" or "name (hint)" for err's broker code, and "" when it
// carries none: the part of an error text or a log line that names the
// answer.
func Describe(err error) string {
	a, ok := OfError(err)
	if !ok {
		return ""
	}
	if h := a.Hint(); h != "" {
		return a.Name + ": " + h
	}
	return a.Name
}
