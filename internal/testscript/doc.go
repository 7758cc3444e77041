// Package testscript tests scripts/test.sh itself: the command CI runs must
// report every failure, so that no re-run, retry or filter can turn a real
// failure (a lost or ghost event, a service that did not come back, a data
// race) into a green run. It has no code of its own; see its tests.
package testscript
