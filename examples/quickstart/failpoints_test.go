//go:build failpoints

package main

// The README blocks are built with the failpoints tag too, reusing this
// binary's packages.
func init() { readmeBuildFlags = append(readmeBuildFlags, "-tags=failpoints") }
