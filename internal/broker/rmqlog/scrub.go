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
	maxDepth     = 10 // rendered
	maxWalkDepth = 64 // walked for payloads
	maxNodes     = 20000
	maxElems     = 64 // elements of a slice, array or map rendered
	// minSecret is the shortest payload (body or property value) that is
	// also searched for in text; a shorter one would cut ordinary words.
	minSecret = 4
)

// Scrub returns the log message and fields with message bodies, byte slices
// and property values removed. fields is not modified.
func Scrub(msg string, fields map[string]interface{}) (string, logrus.Fields) {
	s := &scrubber{secrets: map[string]bool{}}
	type found struct{ dirty, complete bool }
	walked := make(map[string]found, len(fields))
	for k, v := range fields {
		dirty, complete := s.collect(v)
		walked[k] = found{dirty, complete}
	}
	out := make(logrus.Fields, len(fields))
	for k, v := range fields {
		out[k] = s.scrubWalked(v, walked[k].dirty, walked[k].complete)
	}
	return s.text(msg), out
}

// ScrubValue returns v in a form safe to log: messages become a summary
// without body or properties, byte slices their size, string maps their keys
// with only system values, text its ScrubText, errors and Stringers their
// text without the payloads they hold, and any other value that holds a
// payload anywhere inside it a rendering of its structure without them.
// A value that holds none is returned as it is; one too deep or too large
// to walk whole, only its type.
func ScrubValue(v interface{}) interface{} {
	s := &scrubber{secrets: map[string]bool{}}
	dirty, complete := s.collect(v)
	return s.scrubWalked(v, dirty, complete)
}

func (s *scrubber) scrubWalked(v interface{}, dirty, complete bool) interface{} {
	if !complete {
		return fmt.Sprintf("<%T redacted: too large to scrub>", v)
	}
	return s.scrub(v, dirty)
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
}

// collect walks v, records the payloads it holds as secrets, and reports
// whether it holds any (or text that ScrubText changes): such a value is
// not forwarded as it is. complete is false when v was too deep or too
// large to walk whole: its payloads are not all known, so neither is any
// of its text safe.
func (s *scrubber) collect(v interface{}) (dirty, complete bool) {
	w := &walker{s: s, seen: map[uintptr]bool{}}
	dirty = w.walk(reflect.ValueOf(v), 0)
	return dirty || w.incomplete, !w.incomplete
}

// walker is one walk over a value.
type walker struct {
	s          *scrubber
	seen       map[uintptr]bool // pointers, maps and slices walked
	nodes      int
	incomplete bool
}

func (w *walker) walk(rv reflect.Value, depth int) bool {
	if !rv.IsValid() {
		return false
	}
	w.nodes++
	if depth > maxWalkDepth || w.nodes > maxNodes {
		w.incomplete = true
		return true
	}
	s, seen := w.s, w.seen
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
		return w.walk(rv.Field(0), depth+1)
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
		return w.walk(rv.Elem(), depth+1)
	case reflect.Interface:
		return w.walk(rv.Elem(), depth+1)
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
			dirty = w.walk(rv.Index(i), depth+1) || dirty
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
			dirty = w.walk(it.Key(), depth+1) || dirty
			dirty = w.walk(it.Value(), depth+1) || dirty
		}
		return dirty
	case reflect.Struct:
		dirty := false
		for i := 0; i < rv.NumField(); i++ {
			dirty = w.walk(rv.Field(i), depth+1) || dirty
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
		if dirty, _ := s.collect(v); !dirty {
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
	// A byte slice or array in Go syntax (%#v): []byte{0x34, 0x31}, []uint8{...}, [16]uint8{...}.
	reGoBytes = regexp.MustCompile(`\[\d*\](?:byte|uint8)\{`)
	// A byte slice or array printed by fmt (%v, %d), labelled or not: [52 49 49].
	reByteList = regexp.MustCompile(`\[(?:\d{1,3} )+\d{1,3}\]`)
	// A JSON string under a body key: "Body":"NDEx..." (base64 of []byte, or a string).
	reJSONBody = regexp.MustCompile(`(?i)"body"\s*:\s*"`)
	// A body or properties label: Message.String()'s "body=" and
	// "properties=", fmt's "Body:", JSON's "Body":.
	reLabel = regexp.MustCompile(`(?i)\b(?:body|properties)"?\s*([:=])\s*`)
)

// ScrubText removes message bodies, property values and anything else fmt
// renders from a byte slice or a map from text:
//
//   - a map as fmt prints it (map[...], map[string]string{...}), whole:
//     every value may be a property or a header. Its end is taken as the
//     last "]" or "}" of the text, since keys and values may hold brackets;
//   - a byte slice as fmt prints it ([52 49 ...], []byte{0x34, ...});
//   - a message's String(): from "body=" (or "properties=") to the last
//     ", TransactionId=" of the text, which follows every body and property
//     value, however they end;
//   - a JSON string under a "body" key;
//   - after any other body or properties label ("Body:", "body=" with no
//     TransactionId after it), the rest of the text: the end of a body
//     cannot be known.
//
// Each rule finds its spans in the text as given, and the union of the
// spans is cut: a span that one rule finds can never hide where another
// one starts (text may hold what looks like the start or the end of any of
// them, inside a body or a topic).
func ScrubText(s string) string {
	lower := strings.ToLower(s)
	if !strings.Contains(lower, "body") && !strings.Contains(lower, "properties") &&
		!strings.Contains(s, "map[") && !strings.Contains(s, "uint8{") && !strings.Contains(s, "byte{") && !reByteList.MatchString(s) {
		return s
	}
	var spans [][2]int          // content to cut: [from, to)
	construct := map[int]bool{} // where a structure the rules cut begins
	cut := func(at, from, to int) {
		construct[at] = true
		if from < to {
			spans = append(spans, [2]int{from, to})
		}
	}
	lastClose := max(strings.LastIndex(s, "]"), strings.LastIndex(s, "}"))
	mapsFrom := -1 // the maps' span, to lastClose
	for from := 0; ; {
		i := strings.Index(s[from:], "map[")
		if i < 0 {
			break
		}
		i += from
		open, end := i+len("map["), lastClose
		if end < open {
			end = len(s)
		}
		cut(i, open, end)
		if mapsFrom < 0 {
			mapsFrom = open
		}
		from = open
	}
	for _, m := range reGoBytes.FindAllStringIndex(s, -1) {
		end := len(s)
		if k := strings.IndexByte(s[m[1]:], '}'); k >= 0 {
			end = m[1] + k
		}
		cut(m[0], m[1], end)
	}
	for _, m := range reByteList.FindAllStringIndex(s, -1) {
		cut(m[0], m[0]+1, m[1]-1)
	}
	for _, m := range reJSONBody.FindAllStringIndex(s, -1) {
		cut(m[1]-1, m[1], jsonStringEnd(s, m[1]))
	}
	lastTx := strings.LastIndex(s, ", TransactionId=")
	for _, m := range reLabel.FindAllStringSubmatchIndex(s, -1) {
		at := m[1]
		switch {
		case mapsFrom >= 0 && at > mapsFrom && at <= lastClose:
			// A key of a map, whose content is cut whole.
		case s[m[2]] == '=' && lastTx >= at:
			// Message.String(): the body, the flag and the properties.
			spans = append(spans, [2]int{at, lastTx})
		case s[m[2]] == ':' && construct[at]:
			// fmt's or JSON's label of a structure cut above.
		default:
			spans = append(spans, [2]int{at, len(s)})
		}
	}
	return cutSpans(s, spans)
}

// jsonStringEnd is the index of the quote that ends the JSON string whose
// content starts at from (len(s) when it does not end).
func jsonStringEnd(s string, from int) int {
	for i := from; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return len(s)
}

// cutSpans replaces the union of spans in s with Redacted, one per run of
// overlapping or touching spans.
func cutSpans(s string, spans [][2]int) string {
	if len(spans) == 0 {
		return s
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i][0] < spans[j][0] })
	var b strings.Builder
	at := 0
	for i := 0; i < len(spans); {
		from, to := spans[i][0], spans[i][1]
		for i++; i < len(spans) && spans[i][0] <= to; i++ {
			to = max(to, spans[i][1])
		}
		if from < at {
			from = at
		}
		b.WriteString(s[at:from])
		b.WriteString(Redacted)
		at = to
	}
	b.WriteString(s[at:])
	return b.String()
}
