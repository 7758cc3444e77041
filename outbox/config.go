package outbox

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"os"
	"regexp"
	"strconv"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/rmqtx/rmqtx/internal/sqlname"
	"github.com/rmqtx/rmqtx/observe"
)

// Config configures a Dispatcher. Zero values take the documented defaults.
type Config struct {
	// DB is the database holding the outbox table. Required.
	DB *sqlx.DB
	// TablePrefix selects the table <prefix>outbox. Default DefaultPrefix
	// ("rmqtx_"). Validated with internal/sqlname.
	TablePrefix string
	// Sink delivers the rows. Required. The dispatcher does not close it.
	Sink Sink
	// Name identifies this dispatcher in owner tokens and logs. Default:
	// "<hostname>-<pid>-<random>". At most 64 characters of [A-Za-z0-9._-].
	Name string
	// BatchSize is the most rows one claim transaction takes. While every
	// sender is busy, the dispatcher claims again once it has room for half
	// a batch. Default 64.
	BatchSize int
	// Concurrency is the most sends in flight. Beyond them, the dispatcher
	// claims ahead: up to 2*max(BatchSize, Concurrency) claimed rows wait
	// for a sender, fewer when sends are slow (as many as the senders get
	// through, at the measured send duration, in half of LeaseDuration -
	// SendTimeout - LeaseDuration/10), none when SendTimeout leaves less
	// than a fifth of LeaseDuration. A row that waited longer than that
	// margin anyway is handed back unsent, and Shutdown hands back every row
	// still waiting. Default 16.
	Concurrency int
	// PollInterval is how often the table is polled when no Notify arrives.
	// Default 1s.
	PollInterval time.Duration
	// LeaseDuration is how long a claimed row belongs to this dispatcher.
	// After it, another dispatcher may take the row over and send it again.
	// With a BatchSink it bounds a held claim instead: its transaction ends
	// (rolled back, if not committed by then) LeaseDuration after the claim,
	// and the server ends the session of a dispatcher that left it idle that
	// long (a paused or partitioned process). Default 30s. Keep it well
	// above SendTimeout.
	LeaseDuration time.Duration
	// SendTimeout bounds one Sink.Send. Default LeaseDuration/3.
	SendTimeout time.Duration
	// MaxRetries is how many RETRYs a row gets; the next failure makes it
	// DEAD. Default 20. Negative: no retries (the first failure is DEAD).
	MaxRetries int
	// BackoffBase and BackoffMax shape the delay before retry n (n = 0, 1,
	// ...): a uniformly random duration in [0, min(BackoffMax,
	// BackoffBase*2^n)] ("full jitter"). Defaults 500ms and 5m; with
	// MaxRetries 20 a row survives roughly an hour of outage.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// MetricsInterval is how often the backlog gauges (OutboxPending,
	// OutboxOldestAge) are refreshed from the table when Metrics is set.
	// Default 15s.
	MetricsInterval time.Duration
	// Observe holds the Logger, Metrics and TracerProvider (package
	// observe), the same in every rmqtx component: the zero value logs,
	// counts and traces nothing.
	observe.Observe
	// Redact is applied to every error message before it is logged or
	// stored in last_error_message. Default: unchanged.
	Redact func(string) string
	// OnOutcome, when set, is called after each row's outcome is recorded
	// (or found lost). It runs on the send goroutine: keep it fast.
	OnOutcome func(Outcome)
}

// Outcome reports what happened to one claimed row.
type Outcome struct {
	EventID     string
	Destination string
	EventType   string
	// Attempt is the send attempt (retry_count + 1 at claim time).
	Attempt int
	// Status is the status written: SENT, RETRY or DEAD; PENDING or RETRY
	// for a row released at shutdown. Empty when LostLease.
	Status Status
	// RetryIn is the backoff chosen for a RETRY.
	RetryIn time.Duration
	// Err is the classified send error (nil when SENT).
	Err error
	// TookOver is true when the row was claimed after another dispatcher's
	// lease expired.
	TookOver bool
	// LostLease is true when the row had a new owner (or was changed) by the
	// time the outcome was written: nothing was written.
	LostLease bool
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.TablePrefix == "" {
		c.TablePrefix = DefaultPrefix
	}
	if c.Name == "" {
		host, _ := os.Hostname()
		host = nonName.ReplaceAllString(host, "_")
		if len(host) > 32 {
			host = host[:32]
		}
		if host == "" {
			host = "host"
		}
		c.Name = host + "-" + strconv.Itoa(os.Getpid()) + "-" + randomSuffix()[:6]
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 64
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 16
	}
	if c.PollInterval <= 0 {
		c.PollInterval = time.Second
	}
	if c.LeaseDuration <= 0 {
		c.LeaseDuration = 30 * time.Second
	}
	if c.SendTimeout <= 0 {
		c.SendTimeout = c.LeaseDuration / 3
	}
	if c.MaxRetries == 0 {
		c.MaxRetries = 20
	}
	if c.MaxRetries < 0 {
		c.MaxRetries = 0
	}
	if c.BackoffBase <= 0 {
		c.BackoffBase = 500 * time.Millisecond
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = 5 * time.Minute
	}
	if c.MetricsInterval <= 0 {
		c.MetricsInterval = 15 * time.Second
	}
	c.Observe = c.Observe.WithDefaults()
	if c.Redact == nil {
		c.Redact = func(s string) string { return s }
	}
	return c
}

var nonName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

func (c Config) validate() error {
	if c.DB == nil {
		return fmt.Errorf("%w: DB is required", ErrConfig)
	}
	if c.Sink == nil {
		return fmt.Errorf("%w: Sink is required", ErrConfig)
	}
	if err := sqlname.ValidatePrefix(c.TablePrefix); err != nil {
		return fmt.Errorf("%w: TablePrefix: %w", ErrConfig, err)
	}
	if !nameRE.MatchString(c.Name) {
		return fmt.Errorf("%w: Name %q: want 1-64 of [A-Za-z0-9._-]", ErrConfig, c.Name)
	}
	if c.BackoffMax < c.BackoffBase {
		return fmt.Errorf("%w: BackoffMax %s is below BackoffBase %s", ErrConfig, c.BackoffMax, c.BackoffBase)
	}
	if c.SendTimeout >= c.LeaseDuration {
		return fmt.Errorf("%w: SendTimeout %s must be below LeaseDuration %s", ErrConfig, c.SendTimeout, c.LeaseDuration)
	}
	return nil
}

// Backoff returns the full-jitter delay before retry n (0-based): uniform in
// [0, min(max, base*2^n)].
func Backoff(n int, base, max time.Duration) time.Duration {
	return time.Duration(mrand.Int64N(int64(BackoffCeiling(n, base, max)) + 1))
}

// BackoffCeiling is the upper bound of Backoff(n, base, max).
func BackoffCeiling(n int, base, max time.Duration) time.Duration {
	if n < 0 {
		n = 0
	}
	if base <= 0 {
		return 0
	}
	if n >= 62 || base > time.Duration(math.MaxInt64>>uint(n)) {
		return max
	}
	c := base << uint(n)
	if c > max {
		return max
	}
	return c
}

func randomSuffix() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
