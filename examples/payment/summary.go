package main

import (
	"fmt"
	"io"
	"time"
)

// PrintSummary writes the end-of-run summary.
func PrintSummary(w io.Writer, r Result) {
	rep := r.Report
	d := r.Driver
	cb := r.Callbacks
	dedup := r.Points.Duplicates + r.Notify.Duplicates + r.Search.Duplicates
	line := func(label, format string, args ...any) {
		fmt.Fprintf(w, "  %-14s %s\n", label, fmt.Sprintf(format, args...))
	}
	fmt.Fprintf(w, "\n== rmqtx payment demo: run %s (database %s on %s), %s ==\n", r.RunID, r.Database, engineTitle(r.Engine), r.Elapsed.Round(100*time.Millisecond))
	line("payments", "%d made, %d SUCCESS; %d more orders canceled unpaid", d.Paid, rep.Succeeded, d.Canceled)
	if cb.Resent > 0 {
		line("", "%d Sends repeated in place with the same event id (a deadlock or a fenced half committed nothing)", cb.Resent)
	}
	line("callbacks", "%d received: %d applied, %d duplicate no-ops (%d duplicates sent), %d refused, %d answered 503 and retried by the gateway",
		cb.Received, cb.Applied, cb.Duplicates, d.DupCallbacks, cb.Rejected, cb.Unavailable)
	line("", "refused: %d late callbacks for canceled orders (409), %d bad callbacks (forged signature 401, wrong amount 422, unknown payment 404)",
		d.Rejected, d.BadRefused)
	line("events", "%d PaymentSucceeded committed (txlog) via the transactional producer; %d order events (OrderCreated/OrderPaid/OrderCanceled) via outboxes",
		rep.TxlogCommitted, r.Search.Applied+r.Search.Stale)
	line("points", "%d payments credited exactly once, %d points in total", rep.PointsRows, rep.PointsTotal)
	line("notifications", "%d SMS queued, %d delivered (distinct idempotency keys); %d gateway calls, %d throttled by the per-user rate limit",
		rep.Notifications, rep.SMSKeys, r.SMSCalls, r.Throttled)
	line("projection", "%d/%d orders at their latest status and version; %d out-of-order events skipped as stale",
		rep.ProjectionMatch, rep.Orders, r.Search.Stale)
	line("duplicates", "%d absorbed: %d callback no-ops + %d consumer dedup hits (points %d, notification %d, search %d) + %d SMS resends absorbed by the gateway",
		cb.Duplicates+dedup+r.SMSResends, cb.Duplicates, dedup, r.Points.Duplicates, r.Notify.Duplicates, r.Search.Duplicates, r.SMSResends)
	line("faults", "%d consumer failures injected (retried: points %d, notification %d, search %d), %d SMS responses lost, %d producer restart(s), %d events redelivered, %d check-backs answered",
		r.Injected, r.Points.Retries, r.Notify.Retries, r.Search.Retries, r.SMSLost, r.Restarts, d.Redelivered, r.Checks)
	if d.Unexpected > 0 {
		line("driver", "%d unexpected callback answers (see the log)", d.Unexpected)
	}
	if !r.Quiescent {
		line("warning", "the consumers had not caught up when the wait ended")
	}
	if rep.OK() {
		line("reconciliation", "OK: 0 discrepancies (payments SUCCESS = points = notifications = SMS delivered; projection = orders; nothing stuck)")
	} else {
		line("reconciliation", "FAILED: %d discrepancies", len(rep.Discrepancies))
		for _, x := range rep.Discrepancies {
			fmt.Fprintf(w, "    - %s (%d) %v\n", x.Check, x.Count, x.IDs)
		}
	}
	engine := ""
	if r.Engine == EnginePostgres {
		engine = " -engine postgres"
	}
	fmt.Fprintf(w, "  re-check later: go run ./examples/payment reconcile%s -db %s\n", engine, r.Database)
}

// engineTitle names the engine for the summary.
func engineTitle(engine string) string {
	if engine == EnginePostgres {
		return "PostgreSQL"
	}
	return "MySQL/MariaDB"
}
