package checkback

import "github.com/rmqtx/rmqtx/internal/otelx"

// endCheck ends a check span with the decision and, for an answer that
// failed, the reason as the error class (never the error's text).
func endCheck(sp otelx.Span, a Answer) {
	errType := ""
	if a.Err != nil {
		errType = string(a.Reason)
	}
	if sp.Recording() {
		sp.SetReason(string(a.Reason))
	}
	sp.End(a.Decision.String(), errType)
}
