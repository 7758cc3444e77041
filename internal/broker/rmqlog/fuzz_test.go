package rmqlog_test

import (
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/rlog"
)

// FuzzScrubLogCalls makes log calls of random shapes through the client's
// global logger (rlog, as rocketmq-client-go calls it) into the adapter: a
// random level, a message made by fmt from a random format string and
// random arguments, and random fields (random names, values). The values
// nest the card number inside messages (bodies, property values), byte
// slices, string maps, maps, slices, arrays, structs with exported and
// unexported fields, errors (custom, fmt.Errorf with %w and with a value
// formatted in), fmt.Stringers, and the client's PullResult. Whatever the
// shape, the card number appears nowhere in what a sink writes (logrus's
// text and JSON formatters, the message, fmt of the fields), neither as it
// is nor as hex, fmt's byte list or base64.
//
// The generator never lets the card reach text as plain characters from
// outside the call (fmt's %s of a body in the format string, the card in a
// free-text field): nothing can tell that from other text (see scrub.go).
// Free text is drawn from an alphabet without '4' and '%', so the card
// comes only from where the generator puts it, and a format string gets
// only the verbs the generator places. In text (the message, a string
// field, an error made by fmt.Errorf without %w) values are formatted with
// %v, %+v or %#v; inside an error or a Stringer value logged as a field,
// with any of %v %+v %#v %s %q %x %X %d.
func FuzzScrubLogCalls(f *testing.F) {
	for k := byte(0); k < kinds; k++ {
		f.Add([]byte{0, 1, 1, k, 3, 5, 2, 7, 1, 9, 4, 200, 17})
		f.Add([]byte{3, 0, 2, 1, k, k, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13})
	}
	f.Add([]byte("a log call of a random shape, from printable bytes: [] {} map[ body= , Flag="))
	f.Fuzz(func(t *testing.T, program []byte) {
		_, hook := capture(t)
		g := &gen{b: program}
		msg := g.textCall()
		if msg == "" {
			msg = "-" // rlog drops an Info or Warning line with neither message nor fields
		}
		fields := map[string]interface{}{}
		for i, n := 0, g.n(5); i < n; i++ {
			name := g.text(12)
			if g.n(3) == 0 {
				fields[name] = g.textCall() // a value formatted into text first, as the client does
			} else {
				fields[name] = g.value(0, false)
			}
		}
		if len(fields) == 0 && g.n(2) == 0 {
			fields = nil
		}
		[]func(string, map[string]interface{}){rlog.Debug, rlog.Info, rlog.Warning, rlog.Error, rlog.Fatal}[g.n(5)](msg, fields)

		entries := hook.AllEntries()
		if len(entries) != 1 {
			t.Fatalf("%d entries, want 1", len(entries))
		}
		out := rendered(t, entries[0])
		for _, form := range cardForms {
			if strings.Contains(out, form) {
				t.Fatalf("the card leaks as %q:\n%s", form, out)
			}
		}
	})
}

// cardForms are the card as text, hex, fmt's list of its bytes, Go syntax
// and base64.
var cardForms = func() []string {
	b := []byte(card)
	list := fmt.Sprint(b)
	return []string{
		card,
		hex.EncodeToString(b),
		strings.ToUpper(hex.EncodeToString(b)),
		list[1 : len(list)-1],
		strings.TrimSuffix(strings.TrimPrefix(fmt.Sprintf("%#v", b), "[]byte{"), "}"),
		strings.TrimRight(base64.StdEncoding.EncodeToString(b), "="),
	}
}()

// gen draws a log call from the fuzzer's bytes. Once they run out every
// choice is 0, so every input is a whole program.
type gen struct{ b []byte }

func (g *gen) n(k int) int {
	if k <= 1 || len(g.b) == 0 {
		return 0
	}
	v := int(g.b[0])
	g.b = g.b[1:]
	return v % k
}

// alphabet of free text: no '4' (the card's first digit) and no '%'.
const alphabet = "abcxyzXYZ 0123567890_-.:=,;[]{}()\"'<>/\\\n\t|&*#@!?~^$+"

// tokens make free text look like what the scrubber looks for.
var tokens = []string{"body=", "Body:", "properties=", "map[", ", Flag=", "]", "}", "{", "[", "[52 9 1]",
	"TransactionId=", `"Body":"`, "[]uint8{", "map[string]string{", "<redacted>", "\x01", "\x02", "bodySize="}

func (g *gen) text(max int) string {
	var b strings.Builder
	for i, n := 0, g.n(max+1); i < n; i++ {
		if g.n(6) == 0 {
			b.WriteString(tokens[g.n(len(tokens))])
			continue
		}
		b.WriteByte(alphabet[g.n(len(alphabet))])
	}
	return b.String()
}

// payload is a body or a property value with the card inside.
func (g *gen) payload() string {
	p := g.text(10) + card + g.text(10)
	if g.n(4) == 0 {
		p += card
	}
	return p
}

// key is a property name: mostly user properties (redacted); some of the
// client's own names, whose values are kept and so carry no card here.
func (g *gen) key() string {
	switch g.n(4) {
	case 0:
		return []string{"KEYS", "TAGS", "rmqtx.h.card", "tracestate", "RMQTX_BUSINESS_KEY"}[g.n(5)]
	default:
		return "k" + g.text(6)
	}
}

func (g *gen) message() *primitive.Message {
	m := primitive.NewMessage(g.text(8), nil)
	if g.n(4) != 0 {
		m.Body = []byte(g.payload())
	}
	for i, n := 0, g.n(4); i < n; i++ {
		m.WithProperty(g.key(), g.payload())
	}
	if g.n(3) == 0 {
		m.WithProperty(primitive.PropertyUniqueClientMessageIdKeyIndex, g.text(8)) // kept: no card
	}
	if g.n(5) == 0 {
		m.CompressedBody = []byte(g.payload())
	}
	return m
}

func (g *gen) messageExt() *primitive.MessageExt {
	ext := &primitive.MessageExt{Message: *g.message(), MsgId: g.text(8), QueueOffset: int64(g.n(1000)), ReconsumeTimes: int32(g.n(16))}
	if g.n(2) == 0 {
		ext.Queue = &primitive.MessageQueue{Topic: g.text(5), BrokerName: g.text(5), QueueId: g.n(8)}
	}
	return ext
}

// The value kinds value draws from.
const kinds = 18

// value is a random value with the card somewhere inside (or none). text
// says it will be formatted into text: then everything inside formats
// itself with %v, %+v or %#v only.
func (g *gen) value(depth int, text bool) interface{} {
	if depth > 3 {
		return g.clean()
	}
	switch g.n(kinds) {
	case 0:
		return g.message()
	case 1:
		return reflect.ValueOf(g.message()).Elem().Interface() // a Message value (vet: it holds a lock)
	case 2:
		return g.messageExt()
	case 3:
		return reflect.ValueOf(g.messageExt()).Elem().Interface()
	case 4:
		exts := []*primitive.MessageExt{}
		for i, n := 0, 1+g.n(3); i < n; i++ {
			exts = append(exts, g.messageExt())
		}
		return exts
	case 5:
		return []byte(g.payload())
	case 6:
		m := map[string]string{}
		for i, n := 0, 1+g.n(3); i < n; i++ {
			m[g.key()] = g.payload()
		}
		return m
	case 7:
		m := map[string]interface{}{}
		for i, n := 0, g.n(4); i < n; i++ {
			m[g.text(6)] = g.value(depth+1, text)
		}
		return m
	case 8:
		s := []interface{}{}
		for i, n := 0, g.n(4); i < n; i++ {
			s = append(s, g.value(depth+1, text))
		}
		return s
	case 9:
		return [2]interface{}{g.value(depth+1, text), g.value(depth+1, text)}
	case 10:
		h := holder{Name: g.text(6), N: g.n(100), Any: g.value(depth+1, text), hidden: g.value(depth+1, text), Raw: []byte(g.payload())}
		if g.n(2) == 0 {
			h.Msg, h.msg = g.message(), g.message()
		}
		if g.n(2) == 0 {
			h.Props = map[string]string{g.key(): g.payload()}
		}
		if g.n(2) == 0 {
			h.Next = &holder{Name: g.text(4), hidden: g.value(depth+2, text)}
		}
		if g.n(2) == 0 {
			return h
		}
		return &h
	case 11:
		inner, leaf := g.inner(depth, text)
		return cardError{verb: g.verb(text, leaf), inner: inner}
	case 12:
		inner, leaf := g.inner(depth, text)
		return &cardStringer{verb: g.verb(text, leaf), inner: inner}
	case 13:
		inner, leaf := g.inner(depth, text)
		return fmt.Errorf(g.text(6)+": %w", cardError{verb: g.verb(text, leaf), inner: inner})
	case 14:
		// A value formatted into an error's text: only text-safe verbs.
		return fmt.Errorf(g.text(6)+" "+g.verb(true, false), g.value(depth+1, true))
	case 15:
		r := &primitive.PullResult{NextBeginOffset: int64(g.n(100)), Status: primitive.PullFound}
		r.SetMessageExts([]*primitive.MessageExt{g.messageExt()})
		r.SetBody([]byte(g.payload()))
		if g.n(2) == 0 {
			return reflect.ValueOf(r).Elem().Interface()
		}
		return r
	case 16:
		return errors.Join(g.errorValue(depth+1, text), g.errorValue(depth+1, text))
	}
	return g.clean()
}

// inner is what an error or a Stringer holds; leaf says it is a payload
// itself (a byte slice, a string map, a message), which fmt renders with
// any verb in a way the scrubber can find.
func (g *gen) inner(depth int, text bool) (interface{}, bool) {
	switch g.n(4) {
	case 0:
		return []byte(g.payload()), true
	case 1:
		return map[string]string{g.key(): g.payload()}, true
	case 2:
		return g.message(), true
	}
	return g.value(depth+1, text), false
}

func (g *gen) errorValue(depth int, text bool) error {
	if err, ok := g.value(depth, text).(error); ok {
		return err
	}
	inner, leaf := g.inner(depth, text)
	return cardError{verb: g.verb(text, leaf), inner: inner}
}

// verb formats a value: in text, or around a value that is not a payload
// itself, one that shows it as fmt shows a structure; around a payload
// inside a field value, any.
func (g *gen) verb(text, leaf bool) string {
	switch {
	case text:
		return []string{"%v", "%+v", "%#v"}[g.n(3)]
	case leaf:
		return []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d"}[g.n(8)]
	}
	return []string{"%v", "%+v", "%s"}[g.n(3)]
}

// textCall is a message or a string field as the client makes them:
// fmt.Sprintf of a format string with values formatted in.
func (g *gen) textCall() string {
	var format strings.Builder
	var args []interface{}
	for i, n := 0, g.n(4); i < n; i++ {
		format.WriteString(g.text(8))
		if g.n(3) != 0 {
			format.WriteString(g.verb(true, false))
			args = append(args, g.value(0, true))
		}
	}
	format.WriteString(g.text(8))
	return fmt.Sprintf(format.String(), args...)
}

// clean is a value without a card.
func (g *gen) clean() interface{} {
	switch g.n(6) {
	case 0:
		return nil
	case 1:
		return g.n(1000)
	case 2:
		return g.text(10)
	case 3:
		return &primitive.MessageQueue{Topic: g.text(5), BrokerName: g.text(5), QueueId: g.n(8)}
	case 4:
		return errors.New(g.text(10))
	}
	return primitive.SendResult{Status: primitive.SendOK, MsgID: g.text(8)}
}

// holder is a struct of the application's or the client's own, with
// payloads in exported and unexported fields.
type holder struct {
	Name   string
	N      int
	Any    interface{}
	Raw    []byte
	Msg    *primitive.Message
	Props  map[string]string
	Next   *holder
	hidden interface{}
	msg    *primitive.Message
}

// cardError and cardStringer render what they hold with their verb.
type cardError struct {
	verb  string
	inner interface{}
}

func (e cardError) Error() string { return "failed: " + fmt.Sprintf(e.verb, e.inner) }

type cardStringer struct {
	verb  string
	inner interface{}
}

func (s *cardStringer) String() string { return "value " + fmt.Sprintf(s.verb, s.inner) }
