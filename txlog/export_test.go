package txlog

// Retirable exposes the retention rule to the external tests that read its
// plan.
var Retirable = (*Store).retirable
