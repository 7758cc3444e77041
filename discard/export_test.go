package discard

import (
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
)

// Decide runs recovery's in-process retry loop on one message, as the
// subscription does; it reports false when recovery stopped first.
func (r *Recovery) Decide(m *primitive.MessageExt) bool { return r.decide(m) }

// Backoff is the wait after failed attempt n.
func (r *Recovery) Backoff(n int) time.Duration { return r.backoff(n) }
