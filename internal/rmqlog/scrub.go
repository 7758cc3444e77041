package rmqlog

import (
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/sirupsen/logrus"
)

// The client logs whole messages: "executeLocalTransaction but state
// unexpected" on every rolled-back local transaction (field "message", a
// *primitive.Message), and the consume paths log "messages"/"message" as
// []*primitive.MessageExt. Formatted by logrus, a *Message prints its
// String() (body and properties included) and a MessageExt value or a JSON
// formatter prints the Body bytes. Everything the adapter forwards therefore
// goes through Scrub first (I10), whatever the level.

// Redacted replaces a scrubbed body or property value in text.
const Redacted = "<redacted>"

// Scrub returns the log message and fields with message bodies, byte slices
// and property values removed. fields is not modified.
func Scrub(msg string, fields map[string]interface{}) (string, logrus.Fields) {
	out := make(logrus.Fields, len(fields))
	for k, v := range fields {
		out[k] = ScrubValue(v)
	}
	return ScrubText(msg), out
}

var (
	msgPtrType    = reflect.TypeOf((*primitive.Message)(nil))
	msgType       = msgPtrType.Elem()
	msgExtPtrType = reflect.TypeOf((*primitive.MessageExt)(nil))
	msgExtType    = msgExtPtrType.Elem()
	errorType     = reflect.TypeOf((*error)(nil)).Elem()
	stringerType  = reflect.TypeOf((*fmt.Stringer)(nil)).Elem()
)

// ScrubValue returns v in a form safe to log: messages become a summary
// without body or properties, byte slices their size, string maps their keys
// with only system values, text its ScrubText, and any other value that
// could carry a body (a struct, slice or map holding bytes, messages or
// string maps) its scrubbed String()/Error() or only its type.
func ScrubValue(v interface{}) interface{} {
	switch x := v.(type) {
	case nil:
		return nil
	case string:
		return ScrubText(x)
	case []byte:
		return fmt.Sprintf("<%d bytes>", len(x))
	case *primitive.Message:
		return summarizeMessage(x)
	case *primitive.MessageExt:
		return summarizeMessageExt(x)
	case map[string]string:
		return scrubProperties(x)
	case bool, int, int8, int16, int32, int64, uint, uint16, uint32, uint64, float32, float64:
		return x
	}
	rv := reflect.ValueOf(v)
	t := rv.Type()
	switch t {
	case msgType, msgExtType:
		// A value (not a pointer): take an addressable copy to summarize it.
		p := reflect.New(t)
		p.Elem().Set(rv)
		return ScrubValue(p.Interface())
	}
	if !sensitive(t) {
		if err, ok := v.(error); ok {
			return scrubError(err)
		}
		if s, ok := v.(fmt.Stringer); ok {
			if str, ok := safeString(s.String); ok && ScrubText(str) != str {
				return ScrubText(str)
			}
		}
		return v
	}
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		if isNil(rv) {
			return v
		}
		out := make([]interface{}, rv.Len())
		for i := range out {
			out[i] = ScrubValue(rv.Index(i).Interface())
		}
		return out
	}
	if isNil(rv) {
		return fmt.Sprintf("<nil %s>", t)
	}
	if t.Implements(errorType) {
		if s, ok := safeString(v.(error).Error); ok {
			return ScrubText(s)
		}
	}
	if t.Implements(stringerType) {
		if s, ok := safeString(v.(fmt.Stringer).String); ok {
			return ScrubText(s)
		}
	}
	return fmt.Sprintf("<%s redacted>", t)
}

func isNil(rv reflect.Value) bool {
	switch rv.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Map, reflect.Interface, reflect.Func, reflect.Chan:
		return rv.IsNil()
	}
	return false
}

// safeString calls a String/Error method, which may dereference nil.
func safeString(f func() string) (s string, ok bool) {
	defer func() {
		if recover() != nil {
			s, ok = "", false
		}
	}()
	return f(), true
}

// scrubbedError keeps an error an error (logrus formats them specially) with
// its text scrubbed.
type scrubbedError struct{ s string }

func (e scrubbedError) Error() string { return e.s }

func scrubError(err error) interface{} {
	s, ok := safeString(err.Error)
	if !ok {
		return fmt.Sprintf("<%T>", err)
	}
	if c := ScrubText(s); c != s {
		return scrubbedError{c}
	}
	return err
}

// sensitiveTypes caches sensitive per type.
var sensitiveTypes sync.Map // reflect.Type -> bool

// sensitive reports whether a value of type t can hold a message, a byte
// slice or a string map (properties) anywhere inside it. Interface-typed
// fields are not followed: their dynamic values are not known from the type.
func sensitive(t reflect.Type) bool {
	if s, ok := sensitiveTypes.Load(t); ok {
		return s.(bool)
	}
	s := sensitiveWalk(t, map[reflect.Type]bool{})
	sensitiveTypes.Store(t, s)
	return s
}

func sensitiveWalk(t reflect.Type, seen map[reflect.Type]bool) bool {
	if seen[t] {
		return false
	}
	seen[t] = true
	switch t {
	case msgType, msgExtType:
		return true
	}
	switch t.Kind() {
	case reflect.Pointer, reflect.Array:
		return sensitiveWalk(t.Elem(), seen)
	case reflect.Slice:
		return t.Elem().Kind() == reflect.Uint8 || sensitiveWalk(t.Elem(), seen)
	case reflect.Map:
		if t.Key().Kind() == reflect.String && t.Elem().Kind() == reflect.String {
			return true
		}
		return sensitiveWalk(t.Key(), seen) || sensitiveWalk(t.Elem(), seen)
	case reflect.Struct:
		for i := 0; i < t.NumField(); i++ {
			if sensitiveWalk(t.Field(i).Type, seen) {
				return true
			}
		}
	}
	return false
}

// safeProperties are property names whose values the client or rmqtx set
// themselves; every other value (KEYS, TAGS, user properties, headers, the
// business key, the payload hash) may be derived from the payload.
var safeProperties = map[string]bool{
	primitive.PropertyUniqueClientMessageIdKeyIndex:  true,
	primitive.PropertyTransactionID:                  true,
	primitive.PropertyProducerGroup:                  true,
	primitive.PropertyTransactionPrepared:            true,
	primitive.PropertyRealTopic:                      true,
	primitive.PropertyRealQueueId:                    true,
	primitive.PropertyRetryTopic:                     true,
	primitive.PropertyMinOffset:                      true,
	primitive.PropertyMaxOffset:                      true,
	primitive.PropertyReconsumeTime:                  true,
	primitive.PropertyMaxReconsumeTimes:              true,
	primitive.PropertyConsumeStartTime:               true,
	primitive.PropertyDelayTimeLevel:                 true,
	primitive.PropertyWaitStoreMsgOk:                 true,
	primitive.PropertyTranscationCheckTimes:          true,
	primitive.PropertyTranscationPreparedQueueOffset: true,
	primitive.PropertyCheckImmunityTimeInSeconds:     true,
	primitive.PropertyOriginMessageId:                true,
	primitive.PropertyMsgRegion:                      true,
	primitive.PropertyTraceSwitch:                    true,
	primitive.PropertyCluster:                        true,
	primitive.PropertyMsgType:                        true,
	// rmqtx's own envelope (internal/envelope): ids, type and versions only.
	"RMQTX_EVENT_ID":       true,
	"RMQTX_EVENT_TYPE":     true,
	"RMQTX_EVENT_VERSION":  true,
	"RMQTX_AGG_VERSION":    true,
	"RMQTX_FORMAT_VERSION": true,
	// The W3C trace context (internal/otelx): traceparent is a version,
	// random trace and span ids and flags, never derived from data.
	// tracestate stays redacted: vendors and applications put free text in
	// it.
	"traceparent": true,
}

func scrubProperties(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		if safeProperties[k] {
			out[k] = v
		} else {
			out[k] = Redacted
		}
	}
	return out
}

func summarizeMessage(m *primitive.Message) string {
	if m == nil {
		return "<nil message>"
	}
	return "[" + messageFields(m) + "]"
}

func summarizeMessageExt(m *primitive.MessageExt) string {
	if m == nil {
		return "<nil message>"
	}
	queue := "-"
	if m.Queue != nil {
		queue = fmt.Sprintf("%s/%d", m.Queue.BrokerName, m.Queue.QueueId)
	}
	return fmt.Sprintf("[%s, msgId=%s, offsetMsgId=%s, queue=%s, queueOffset=%d, reconsumeTimes=%d]",
		messageFields(&m.Message), m.MsgId, m.OffsetMsgId, queue, m.QueueOffset, m.ReconsumeTimes)
}

// messageFields: the topic, the safe properties (sorted) and the body size.
func messageFields(m *primitive.Message) string {
	if m == nil {
		return "<nil message>"
	}
	props := scrubProperties(m.GetProperties())
	keys := make([]string, 0, len(props))
	for k, v := range props {
		if v != Redacted {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "topic=%s, bodySize=%d", m.Topic, len(m.Body))
	for _, k := range keys {
		fmt.Fprintf(&b, ", %s=%s", k, props[k])
	}
	if n := len(props) - len(keys); n > 0 {
		fmt.Fprintf(&b, ", %d other properties redacted", n)
	}
	return b.String()
}

var (
	// Message.String(): "[topic=T, body=B, Flag=F, properties=P, TransactionId=X]".
	// Greedy, so a body that itself contains ", Flag=" is still cut whole.
	reStringBody  = regexp.MustCompile(`(?s)\bbody=.*, Flag=`)
	reStringProps = regexp.MustCompile(`(?s)\bproperties=.*, TransactionId=`)
	// A byte slice printed by fmt: Body:[52 49 49 ...].
	reBytesBody = regexp.MustCompile(`(?i)\b(body"?\s*[:=]\s*)\[[0-9 ]*\]`)
	// A JSON string: "Body":"NDEx..." (base64 of []byte, or a string).
	reJSONBody = regexp.MustCompile(`(?i)("body"\s*:\s*)"(?:[^"\\]|\\.)*"`)
	// Any other body or properties label: everything after it is cut.
	reRestLabel = regexp.MustCompile(`(?i)\b(body|properties)"?\s*[:=]\s*`)
)

// ScrubText removes message bodies and property values from text: the
// String() of a message, fmt's rendering of a Body byte slice, a JSON body,
// and after any other "body=", "Body:" or "properties=" label, the rest of
// the text (the end of a body cannot be known, so nothing after it is kept).
func ScrubText(s string) string {
	if !strings.Contains(strings.ToLower(s), "body") && !strings.Contains(strings.ToLower(s), "properties") {
		return s
	}
	s = reStringBody.ReplaceAllString(s, "body="+Redacted+", Flag=")
	s = reStringProps.ReplaceAllString(s, "properties="+Redacted+", TransactionId=")
	s = reBytesBody.ReplaceAllString(s, "${1}["+Redacted+"]")
	s = reJSONBody.ReplaceAllString(s, `${1}"`+Redacted+`"`)
	for _, loc := range reRestLabel.FindAllStringIndex(s, -1) {
		rest := s[loc[1]:]
		if strings.HasPrefix(rest, Redacted) || strings.HasPrefix(rest, "\""+Redacted) || strings.HasPrefix(rest, "["+Redacted) {
			continue
		}
		return s[:loc[1]] + Redacted
	}
	return s
}
