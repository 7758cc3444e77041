// Package testscript tests scripts/test.sh itself: the command CI runs must
// report every failure, so that no re-run, retry or filter can turn a real
// failure (a lost or ghost event, a service that did not come back, a data
// race) into a green run, and it must fail a run that did not run the proof
// (a skipped test, a listed test or suite that did not run, in either
// client build, a build without the failpoints tag). It
// drives the path `make test` takes (test.sh --suite: inner) with a fake go
// and stub services, and plants faults into copies of the script to show
// that each is caught. It also runs scripts/services.sh from a 0700 folder
// (as root, PostgreSQL's user cannot enter it) and scripts/demo.sh with stub
// services, so that the README's two commands work from any folder and the
// demo starts only its own database. It has no code of its own; see its tests.
package testscript
