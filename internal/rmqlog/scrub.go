package rmqlog

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/sirupsen/logrus"
)

// The client logs whole messages: "executeLocalTransaction but state
// unexpected" on every rolled-back local transaction (field "message", a
// *primitive.Message), the consume paths log "messages"/"message" as
// []*primitive.MessageExt, a failed queue lock logs the broker's response
// (a remoting command with a Body and ExtFields), and some lines format
// values into the text first. Formatted by logrus, a *Message prints its
// String() (body and properties included) and a MessageExt value or a JSON
// formatter prints the Body bytes. Everything the adapter forwards therefore
// goes through Scrub first (I10), whatever the level.
//
// Scrub goes by what a value is, not by the shape of a known log line: it
// walks every field value (through pointers, interfaces, slices, arrays,
// maps and struct fields, exported or not) and removes whatever can carry a
// payload: message bodies and property values, any byte slice or array,
// any string-to-string map (properties, headers, ExtFields). A value that
// holds none of these is forwarded as it is. Error and Stringer values that
// hold one keep their text, with every rendering of the payloads found in
// the call (raw, quoted, hex, base64) cut out of it. Text (the message and
// string values) is cleaned of anything fmt renders from a message, a byte
// slice or a map (ScrubText), and of those renderings too.
//
// What it cannot see is a payload that reached the text as plain characters
// from a value that is not in the call (fmt's %s of a body in a format
// string): nothing then tells it from other text. rocketmq-client-go's
// call sites format queues, groups, offsets, statuses and request headers
// into text, never a body.

// Redacted replaces a scrubbed body or property value in text.
const Redacted = "<redacted>"

// Limits of the walk over one value: deeper or larger values are replaced
// by their type.
const (
	maxDepth = 10
	maxNodes = 20000
	maxElems = 64 // elements of a slice, array or map rendered
	// minSecret is the shortest payload (body or property value) that is
	// also searched for in text; a shorter one would cut ordinary words.
	minSecret = 4
)

// Scrub returns the log message and fields with message bodies, byte slices
// and property values removed. fields is not modified.
func Scrub(msg string, fields map[string]interface{}) (string, logrus.Fields) {
	s := &scrubber{secrets: map[string]bool{}}
	dirty := make(map[string]bool, len(fields))
	for k, v := range fields {
		dirty[k] = s.collect(v)
	}
	out := make(logrus.Fields, len(fields))
	for k, v := range fields {
		out[k] = s.scrub(v, dirty[k])
	}
	return s.text(msg), out
}

// ScrubValue returns v in a form safe to log: messages become a summary
// without body or properties, byte slices their size, string maps their keys
// with only system values, text its ScrubText, errors and Stringers their
// text without the payloads they hold, and any other value that holds a
// payload anywhere inside it a rendering of its structure without them.
// A value that holds none is returned as it is.
func ScrubValue(v interface{}) interface{} {
	s := &scrubber{secrets: map[string]bool{}}
	return s.scrub(v, s.collect(v))
}

var (
	msgType       = reflect.TypeOf(primitive.Message{})
	msgExtType    = reflect.TypeOf(primitive.MessageExt{})
	errorType     = reflect.TypeOf((*error)(nil)).Elem()
	stringerType  = reflect.TypeOf((*fmt.Stringer)(nil)).Elem()
	msgPtrType    = reflect.PointerTo(msgType)
	msgExtPtrType = reflect.PointerTo(msgExtType)
)

// scrubber scrubs the fields and text of one log call. secrets are the
// renderings of every payload its fields hold, cut from all of its text.
type scrubber struct {
	secrets map[string]bool
	sorted  []string // secrets, longest first; nil until text needs them
	nodes   int
}

// collect walks v, records the payloads it holds as secrets, and reports
// whether it holds any (or text that ScrubText changes, or is too large to
// walk): such a value is not forwarded as it is.
func (s *scrubber) collect(v interface{}) bool {
	s.nodes = 0
	return s.walk(reflect.ValueOf(v), 0, map[uintptr]bool{})
}

func (s *scrubber) walk(rv reflect.Value, depth int, seen map[uintptr]bool) bool {
	if !rv.IsValid() {
		return false
	}
	s.nodes++
	if depth > maxDepth || s.nodes > maxNodes {
		return true
	}
	t := rv.Type()
	switch t {
	case msgType:
		_, bodies, props := messageParts(rv)
		for _, b := range bodies {
			s.addSecret(b)
		}
		s.addProperties(props)
		return true
	case msgExtType:
		return s.walk(rv.Field(0), depth+1, seen)
	}
	if leafTypes[t] {
		return false
	}
	switch t.Kind() {
	case reflect.String:
		str := rv.String()
		return ScrubText(str) != str
	case reflect.Pointer:
		if rv.IsNil() {
			return false
		}
		if seen[rv.Pointer()] {
			return false
		}
		seen[rv.Pointer()] = true
		return s.walk(rv.Elem(), depth+1, seen)
	case reflect.Interface:
		return s.walk(rv.Elem(), depth+1, seen)
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			s.addSecret(byteString(rv))
			return true
		}
		if t.Kind() == reflect.Slice && (rv.IsNil() || rv.Len() > 0 && seen[rv.Pointer()]) {
			return false
		}
		if t.Kind() == reflect.Slice {
			seen[rv.Pointer()] = true
		}
		dirty := false
		for i := 0; i < rv.Len(); i++ {
			dirty = s.walk(rv.Index(i), depth+1, seen) || dirty
		}
		return dirty
	case reflect.Map:
		if rv.IsNil() {
			return false
		}
		if t.Key().Kind() == reflect.String && t.Elem().Kind() == reflect.String {
			s.addProperties(stringMap(rv))
			return true
		}
		if seen[rv.Pointer()] {
			return false
		}
		seen[rv.Pointer()] = true
		dirty := false
		it := rv.MapRange()
		for it.Next() {
			dirty = s.walk(it.Key(), depth+1, seen) || dirty
			dirty = s.walk(it.Value(), depth+1, seen) || dirty
		}
		return dirty
	case reflect.Struct:
		dirty := false
		for i := 0; i < rv.NumField(); i++ {
			dirty = s.walk(rv.Field(i), depth+1, seen) || dirty
		}
		return dirty
	}
	return false
}

// leafTypes are logged as they are without a look inside: times, and
// network addresses (an IP is a byte slice, not a payload).
var leafTypes = map[reflect.Type]bool{}

func init() {
	for _, v := range []interface{}{
		time.Time{}, time.Duration(0), time.Month(0), time.Weekday(0), (*time.Location)(nil),
		net.IP{}, net.IPMask{}, net.IPNet{}, net.TCPAddr{}, net.UDPAddr{}, net.IPAddr{}, net.UnixAddr{},
		netip.Addr{}, netip.AddrPort{}, netip.Prefix{},
	} {
		t := reflect.TypeOf(v)
		leafTypes[t] = true
		if t.Kind() != reflect.Pointer {
			leafTypes[reflect.PointerTo(t)] = true
		}
	}
}

// addSecret records the renderings of a payload that fmt, strconv and
// encoding/json give: as it is, quoted (%q), hex (%x, %X) and base64 (a
// []byte in JSON).
func (s *scrubber) addSecret(p string) {
	if len(p) < minSecret {
		return
	}
	s.sorted = nil
	for _, r := range []string{
		p,
		strings.Trim(strconv.Quote(p), `"`),
		strings.Trim(strconv.QuoteToASCII(p), `"`),
		hex.EncodeToString([]byte(p)),
		strings.ToUpper(hex.EncodeToString([]byte(p))),
		base64.StdEncoding.EncodeToString([]byte(p)),
	} {
		s.secrets[r] = true
	}
}

// addProperties records the values of props that are not safe (see
// safeProperties) as secrets.
func (s *scrubber) addProperties(props map[string]string) {
	for k, v := range props {
		if !safeProperties[k] {
			s.addSecret(v)
		}
	}
}

// text cleans text: the renderings of the call's payloads first (they
// match whole before ScrubText cuts around them), then ScrubText.
func (s *scrubber) text(str string) string {
	if len(s.secrets) > 0 {
		if s.sorted == nil {
			for sec := range s.secrets {
				s.sorted = append(s.sorted, sec)
			}
			sort.Slice(s.sorted, func(i, j int) bool { return len(s.sorted[i]) > len(s.sorted[j]) })
		}
		for _, sec := range s.sorted {
			if strings.Contains(str, sec) {
				str = strings.ReplaceAll(str, sec, Redacted)
			}
		}
	}
	return ScrubText(str)
}

// scrub returns v safe to log; dirty is what collect said of it.
func (s *scrubber) scrub(v interface{}, dirty bool) interface{} {
	switch x := v.(type) {
	case nil:
		return nil
	case string:
		return s.text(x)
	case bool, int, int8, int16, int32, int64, uint, uint16, uint32, uint64, float32, float64:
		return x
	}
	if !dirty {
		// Nothing inside is a payload; its text may still show one that
		// another field of the call holds.
		if err, ok := v.(error); ok {
			return s.errorText(err, v)
		}
		if str, ok := v.(fmt.Stringer); ok {
			if text, ok := safeString(str.String); ok && s.text(text) != text {
				return s.text(text)
			}
		}
		return v
	}
	return s.render(reflect.ValueOf(v), 0, map[uintptr]bool{})
}

// errorText keeps an error an error (logrus formats them specially) with
// its text cleaned; err itself when nothing changed.
func (s *scrubber) errorText(err error, v interface{}) interface{} {
	text, ok := safeString(err.Error)
	if !ok {
		return fmt.Sprintf("<%T>", v)
	}
	if c := s.text(text); c != text {
		return scrubbedError{c}
	}
	return err
}

// render is the scrubbed form of a value that holds a payload (or may).
func (s *scrubber) render(rv reflect.Value, depth int, seen map[uintptr]bool) interface{} {
	if !rv.IsValid() {
		return nil
	}
	t := rv.Type()
	if depth > maxDepth {
		return fmt.Sprintf("<%s redacted>", t)
	}
	switch t {
	case msgType:
		return "[" + messageSummary(rv) + "]"
	case msgExtType:
		return messageExtSummary(rv)
	case msgPtrType, msgExtPtrType:
		if rv.IsNil() {
			return "<nil message>"
		}
		return s.render(rv.Elem(), depth+1, seen)
	}
	if rv.CanInterface() && t.Kind() != reflect.Interface {
		v := rv.Interface()
		if s.nodes = 0; !s.walk(rv, 0, map[uintptr]bool{}) {
			return s.scrub(v, false)
		}
		// An error or a Stringer keeps its text, without the payloads.
		if t.Implements(errorType) && !isNil(rv) {
			if text, ok := safeString(v.(error).Error); ok {
				return scrubbedError{s.text(text)}
			}
		}
		if t.Implements(stringerType) && !isNil(rv) {
			if text, ok := safeString(v.(fmt.Stringer).String); ok {
				return s.text(text)
			}
		}
	}
	switch t.Kind() {
	case reflect.Pointer:
		if rv.IsNil() {
			return nil
		}
		if seen[rv.Pointer()] {
			return fmt.Sprintf("<cycle %s>", t)
		}
		seen[rv.Pointer()] = true
		return s.render(rv.Elem(), depth+1, seen)
	case reflect.Interface:
		if rv.IsNil() {
			return nil
		}
		return s.render(rv.Elem(), depth+1, seen)
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return fmt.Sprintf("<%d bytes>", rv.Len())
		}
		if t.Kind() == reflect.Slice && rv.IsNil() {
			return nil
		}
		n := min(rv.Len(), maxElems)
		out := make([]interface{}, n, n+1)
		for i := range out {
			out[i] = s.render(rv.Index(i), depth+1, seen)
		}
		if rv.Len() > n {
			out = append(out, fmt.Sprintf("<%d more>", rv.Len()-n))
		}
		return out
	case reflect.Map:
		if rv.IsNil() {
			return nil
		}
		if t.Key().Kind() == reflect.String && t.Elem().Kind() == reflect.String {
			return scrubProperties(stringMap(rv))
		}
		out := make(map[string]interface{}, min(rv.Len(), maxElems))
		it := rv.MapRange()
		for it.Next() {
			if len(out) == maxElems {
				out["<more>"] = fmt.Sprintf("<%d more>", rv.Len()-maxElems)
				break
			}
			out[fmt.Sprint(s.render(it.Key(), depth+1, seen))] = s.render(it.Value(), depth+1, seen)
		}
		return out
	case reflect.Struct:
		var b strings.Builder
		b.WriteString(t.String() + "{")
		for i := 0; i < rv.NumField(); i++ {
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%s:%v", t.Field(i).Name, s.render(rv.Field(i), depth+1, seen))
		}
		b.WriteByte('}')
		return b.String()
	case reflect.String:
		return s.text(rv.String())
	case reflect.Bool:
		return rv.Bool()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return rv.Uint()
	case reflect.Float32, reflect.Float64:
		return rv.Float()
	}
	return fmt.Sprintf("<%s>", t)
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

// byteString is the content of a byte slice or array, read by reflection
// (it may sit in an unexported field).
func byteString(rv reflect.Value) string {
	if rv.Kind() == reflect.Slice && rv.CanInterface() {
		if b, ok := rv.Interface().([]byte); ok {
			return string(b)
		}
	}
	b := make([]byte, rv.Len())
	for i := range b {
		b[i] = byte(rv.Index(i).Uint())
	}
	return string(b)
}

// stringMap copies a map whose keys and values are strings, read by
// reflection.
func stringMap(rv reflect.Value) map[string]string {
	out := make(map[string]string, rv.Len())
	it := rv.MapRange()
	for it.Next() {
		out[it.Key().String()] = it.Value().String()
	}
	return out
}

// messageParts reads a primitive.Message value: its topic, its payloads
// (Body and CompressedBody) and its properties, through its locked getter
// when it can, by reflection when it sits in an unexported field.
func messageParts(rv reflect.Value) (topic string, bodies []string, props map[string]string) {
	if rv.CanAddr() && rv.Addr().CanInterface() {
		m := rv.Addr().Interface().(*primitive.Message)
		return m.Topic, []string{string(m.Body), string(m.CompressedBody)}, m.GetProperties()
	}
	props = map[string]string{}
	if p := rv.FieldByName("properties"); p.IsValid() && !p.IsNil() {
		props = stringMap(p)
	}
	bodies = []string{byteString(rv.FieldByName("Body")), byteString(rv.FieldByName("CompressedBody"))}
	return rv.FieldByName("Topic").String(), bodies, props
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
	// rmqtx's own envelope (package wire): ids, type and versions only.
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

// messageSummary: the topic, the safe properties (sorted) and the body
// size of a primitive.Message value.
func messageSummary(rv reflect.Value) string {
	topic, _, all := messageParts(rv)
	props := scrubProperties(all)
	keys := make([]string, 0, len(props))
	for k, v := range props {
		if v != Redacted {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b strings.Builder
	fmt.Fprintf(&b, "topic=%s, bodySize=%d", ScrubText(topic), rv.FieldByName("Body").Len())
	for _, k := range keys {
		fmt.Fprintf(&b, ", %s=%s", k, props[k])
	}
	if n := len(props) - len(keys); n > 0 {
		fmt.Fprintf(&b, ", %d other properties redacted", n)
	}
	return b.String()
}

// messageExtSummary adds a MessageExt's ids and place to its message's
// summary.
func messageExtSummary(rv reflect.Value) string {
	queue := "-"
	if q := rv.Field(0).FieldByName("Queue"); q.IsValid() && !q.IsNil() {
		queue = fmt.Sprintf("%s/%d", q.Elem().FieldByName("BrokerName").String(), q.Elem().FieldByName("QueueId").Int())
	}
	return fmt.Sprintf("[%s, msgId=%s, offsetMsgId=%s, queue=%s, queueOffset=%d, reconsumeTimes=%d]",
		messageSummary(rv.Field(0)), rv.FieldByName("MsgId").String(), rv.FieldByName("OffsetMsgId").String(), queue,
		rv.FieldByName("QueueOffset").Int(), rv.FieldByName("ReconsumeTimes").Int())
}

var (
	// Message.String(): "[topic=T, body=B, Flag=F, properties=P, TransactionId=X]":
	// from the body to the last ", TransactionId=", over the properties:
	// a body or a property value may itself hold ", Flag=" or
	// ", TransactionId=", and the last one comes after them all.
	reStringBody  = regexp.MustCompile(`(?s)\bbody=.*, TransactionId=`)
	reStringProps = regexp.MustCompile(`(?s)\bproperties=.*, TransactionId=`)
	// A byte slice or array in Go syntax (%#v): []byte{0x34, 0x31}, []uint8{...}, [16]uint8{...}.
	reGoBytes = regexp.MustCompile(`(\[\d*\](?:byte|uint8)\{)[^}]*\}`)
	// A byte slice or array printed by fmt (%v, %d), labelled or not: [52 49 49].
	reByteList = regexp.MustCompile(`\[(?:\d{1,3} )+\d{1,3}\]`)
	// A JSON string: "Body":"NDEx..." (base64 of []byte, or a string).
	reJSONBody = regexp.MustCompile(`(?i)("body"\s*:\s*)"(?:[^"\\]|\\.)*"`)
	// Any other body or properties label: everything after it is cut.
	reRestLabel = regexp.MustCompile(`(?i)\b(body|properties)"?\s*[:=]\s*`)
	// What the rules above leave after a label.
	reRedactedStart = regexp.MustCompile(`^(?:"|\[|map\[|\[\d*\](?:byte|uint8)\{)?` + regexp.QuoteMeta(Redacted))
)

// ScrubText removes message bodies, property values and anything else fmt
// renders from a byte slice or a map from text: the String() of a message
// (body and properties), a byte slice as fmt prints it ([52 49 ...], and
// []byte{0x34, ...}), the whole content of a map as fmt prints it
// (map[...], map[string]string{...}: every one of its values may be a
// property or a header), a JSON body, and after any other "body=", "Body:"
// or "properties=" label, the rest of the text (the end of a body cannot be
// known, so nothing after it is kept).
func ScrubText(s string) string {
	lower := strings.ToLower(s)
	if !strings.Contains(lower, "body") && !strings.Contains(lower, "properties") &&
		!strings.Contains(s, "map[") && !strings.Contains(s, "uint8{") && !strings.Contains(s, "byte{") && !reByteList.MatchString(s) {
		return s
	}
	// Maps first: their span is the widest (to the last bracket), so no
	// other rule's span can start inside a map and end before its content
	// does, leaving the rest of it behind.
	s = scrubMaps(s)
	s = reStringBody.ReplaceAllString(s, "body="+Redacted+", TransactionId=")
	s = reStringProps.ReplaceAllString(s, "properties="+Redacted+", TransactionId=")
	s = reGoBytes.ReplaceAllString(s, "${1}"+Redacted+"}")
	s = reByteList.ReplaceAllString(s, "["+Redacted+"]")
	s = reJSONBody.ReplaceAllString(s, `${1}"`+Redacted+`"`)
	for _, loc := range reRestLabel.FindAllStringIndex(s, -1) {
		if reRedactedStart.MatchString(s[loc[1]:]) {
			continue
		}
		return s[:loc[1]] + Redacted
	}
	return s
}

// scrubMaps replaces the content of every map fmt printed in s with
// Redacted: from the first "map[" to the last "]" or "}" of s, whichever
// comes later. Not to the map's own closing bracket: keys and values may
// hold brackets, and a map in Go syntax (map[string]string{...}) closes
// with a brace, so a later map's or struct's bracket is the only bound
// that surely covers them all. When neither follows, the rest of s.
func scrubMaps(s string) string {
	for from := 0; ; {
		i := strings.Index(s[from:], "map[")
		if i < 0 {
			return s
		}
		open := from + i + len("map[")
		end := max(strings.LastIndex(s[open:], "]"), strings.LastIndex(s[open:], "}"))
		if end < 0 {
			return s[:open] + Redacted
		}
		s = s[:open] + Redacted + s[open+end:]
		from = open + len(Redacted)
	}
}
