package rmqlog

// ResetElsewhereNotice lets a test see the once-per-process notice again.
func ResetElsewhereNotice() { elsewhereNoticed.Store(false) }
