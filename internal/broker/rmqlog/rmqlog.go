// Package rmqlog routes rocketmq-client-go's global logger (rlog) into a
// logrus.FieldLogger. The client's logger is process-wide; rmqtx installs a
// quiet adapter once, and a caller may route it to their own logger.
//
// The client logs whole messages, bodies included (every rolled-back local
// transaction is logged at error level with its message), so the adapter
// scrubs bodies, byte slices and property values from every message and
// field it forwards, at every level (I10): see Scrub.
package rmqlog

import (
	"io"
	"reflect"
	"sync"
	"sync/atomic"

	"github.com/apache/rocketmq-client-go/v2/rlog"
	"github.com/sirupsen/logrus"
)

// Quiet returns a logger that discards everything: the library default.
func Quiet() logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	l.SetLevel(logrus.PanicLevel)
	return l
}

// OrQuiet returns l, or a quiet logger when l is nil.
func OrQuiet(l logrus.FieldLogger) logrus.FieldLogger {
	if l == nil {
		return Quiet()
	}
	return l
}

// adapter forwards the client's log calls to the current target, every
// message and field scrubbed of message bodies and property values first
// (see Scrub).
type adapter struct{}

// target is the logger the adapter forwards to. rlog's logger is a plain
// global the client's goroutines read without synchronisation, so it is set
// once (to the adapter) and Route swaps this pointer instead.
type target struct{ l logrus.FieldLogger }

var current atomic.Pointer[target]

// elsewhereNoticed is set once Install has said, on some component's
// logger, that the client's lines go to another logger.
var elsewhereNoticed atomic.Bool

// log scrubs and forwards one line, unless the target would drop it: the
// client logs at debug on every pull, and scrubbing costs reflection.
func (adapter) log(level logrus.Level, msg string, f map[string]interface{}) {
	level = levelOf(level, msg, f)
	t := current.Load()
	if t == nil || !enabled(t.l, level) {
		return
	}
	msg, fields := Scrub(msg, f)
	t.l.WithFields(fields).Log(level, msg)
}

// enabled reports whether l logs at level, when l can tell.
func enabled(l logrus.FieldLogger, level logrus.Level) bool {
	switch x := l.(type) {
	case *logrus.Logger:
		return x.IsLevelEnabled(level)
	case *logrus.Entry:
		return x.Logger == nil || x.Logger.IsLevelEnabled(level)
	}
	return true
}

func (a adapter) Debug(msg string, f map[string]interface{}) { a.log(logrus.DebugLevel, msg, f) }

// Info is mapped to Debug: the client's Info is chatty (one line per rebalance).
func (a adapter) Info(msg string, f map[string]interface{}) { a.log(logrus.DebugLevel, msg, f) }

func (a adapter) Warning(msg string, f map[string]interface{}) { a.log(logrus.WarnLevel, msg, f) }

func (a adapter) Error(msg string, f map[string]interface{}) { a.log(logrus.ErrorLevel, msg, f) }

// Fatal is logged as an error: library code never exits the process.
func (a adapter) Fatal(msg string, f map[string]interface{}) { a.log(logrus.ErrorLevel, msg, f) }

func (a adapter) Level(string)            {}
func (a adapter) OutputPath(string) error { return nil }

var once sync.Once

func setAdapter() { once.Do(func() { rlog.SetLogger(adapter{}) }) }

// Install routes rlog to l (quiet when nil). The client's logger is global,
// so only the first call in a process takes effect; later producers and
// consumers reuse it. The first later call with a different logger says so
// on that logger, at Info, once per process: its component's Logger does
// not receive the client's lines, and observe.RouteClientLog (Route)
// chooses. Repeating it for every component started would be noise.
func Install(l logrus.FieldLogger) {
	setAdapter()
	if current.CompareAndSwap(nil, &target{OrQuiet(l)}) || l == nil {
		return
	}
	if t := current.Load(); t != nil && !same(t.l, l) && elsewhereNoticed.CompareAndSwap(false, true) {
		l.Info("rmqtx: rocketmq-client-go's log lines go to the logger of the first rmqtx component started in this process, " +
			"not to this one; call observe.RouteClientLog to choose")
	}
}

// same reports whether a and b are the same logger, without comparing
// values whose type cannot be compared.
func same(a, b logrus.FieldLogger) bool {
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	return ta == tb && ta != nil && ta.Comparable() && a == b
}

// Route replaces the client's global logger unconditionally, safely while
// clients are running. The client's Info level is chatty (one line per
// rebalance), so it is mapped to Debug.
func Route(l logrus.FieldLogger) {
	current.Store(&target{OrQuiet(l)})
	setAdapter()
}
