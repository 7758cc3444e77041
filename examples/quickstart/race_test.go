//go:build race

package main

// The README blocks are built with -race too, reusing this binary's packages.
func init() { readmeBuildFlags = append(readmeBuildFlags, "-race") }
