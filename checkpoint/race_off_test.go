//go:build !race

package checkpoint

const raceBuild = false
