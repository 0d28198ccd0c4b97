//go:build race

package checkpoint

// raceBuild: timings are not judged under the race detector, which slows code 2-20x.
const raceBuild = true
