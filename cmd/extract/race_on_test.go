//go:build race

package main

// raceBuild makes TestMain build the binary under test with -race too.
const raceBuild = true
