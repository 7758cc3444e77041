// Package interop holds the integration tests that run real Java programs
// (interop/java, built by scripts/interop-java.sh) against the local test
// bed, in both directions: a Java consumer reads rmqtx events, and rmqtx
// consumers apply events written by Java producers, the natural Java way
// (with adoption) and in the documented wire format (WIRE.md). The package
// has no code of its own.
package interop
