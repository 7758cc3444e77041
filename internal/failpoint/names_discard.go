package failpoint

// Named points of discard recovery (package discard).
const (
	// AfterRepublish: recovery republished a discarded half's committed
	// event, the txlog row is not yet marked REPUBLISHED.
	AfterRepublish = "recovery.after-republish"
)
