// Package upgradetest holds no code: its test proves the migration guide.
// testdata/previous/main.go is a program written against rmqtx's previous
// release (commit f53b9c9, the last before issue 22 changed the public
// API). The test rewrites it with the guide's mechanical rules
// (testdata/rules.txt, the rules CHANGELOG.md's "Migrating from the
// previous release" cites) and builds the result against this tree, so a
// public API change that the guide does not cover fails the test.
//
// It is a package of its own, not a test of observe or consumer, because it
// is about the whole public surface and builds a separate module (a
// temporary go.mod that replaces rmqtx with this checkout), as a user's
// program would.
package upgradetest
