// Package rmqlog routes rocketmq-client-go's global logger (rlog) into a
// logrus.FieldLogger. The client's logger is process-wide; rmqtx installs a
// quiet adapter once, and a caller may route it to their own logger.
package rmqlog

import (
	"io"
	"sync"

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

type adapter struct{ l logrus.FieldLogger }

func (a adapter) Debug(msg string, f map[string]interface{}) { a.l.WithFields(f).Debug(msg) }
func (a adapter) Info(msg string, f map[string]interface{})  { a.l.WithFields(f).Debug(msg) }
func (a adapter) Warning(msg string, f map[string]interface{}) {
	a.l.WithFields(f).Warn(msg)
}
func (a adapter) Error(msg string, f map[string]interface{}) { a.l.WithFields(f).Error(msg) }

// Fatal is logged as an error: library code never exits the process.
func (a adapter) Fatal(msg string, f map[string]interface{}) { a.l.WithFields(f).Error(msg) }
func (a adapter) Level(string)                               {}
func (a adapter) OutputPath(string) error                    { return nil }

var once sync.Once

// Install routes rlog to l (quiet when nil). The client's logger is global,
// so only the first call in a process takes effect; later producers and
// consumers reuse it. Call Route to replace it deliberately.
func Install(l logrus.FieldLogger) {
	once.Do(func() { rlog.SetLogger(adapter{OrQuiet(l)}) })
}

// Route replaces the client's global logger unconditionally. The client's
// Info level is chatty (one line per rebalance), so it is mapped to Debug.
func Route(l logrus.FieldLogger) {
	once.Do(func() {})
	rlog.SetLogger(adapter{OrQuiet(l)})
}
