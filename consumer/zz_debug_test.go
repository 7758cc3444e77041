package consumer

import (
	"os"

	"github.com/sirupsen/logrus"

	"github.com/rmqtx/rmqtx/internal/rmqlog"
)

func init() {
	if p := os.Getenv("ZZ_DEBUG_LOG"); p != "" {
		f, _ := os.Create(p)
		l := logrus.New()
		l.SetOutput(f)
		l.SetLevel(logrus.DebugLevel)
		rmqlog.Route(l)
	}
}
