package shm

import (
	"fmt"
	"regexp"
	"strconv"
)

// RID identifies one attempt at one sample: "s<sample, 9 digits>-a<attempt>". A new
// attempt gets a new RID, so a late dump of an earlier attempt is never taken for the
// current one.
type RID struct {
	Sample  int
	Attempt int
}

// DumpSuffix is the extension of a complete dump; PartialSuffix marks one being written.
const (
	DumpSuffix    = ".safetensors"
	PartialSuffix = ".partial"
)

var ridPattern = regexp.MustCompile(`^s([0-9]{9})-a([1-9][0-9]{0,8})$`)

func (r RID) String() string { return fmt.Sprintf("s%09d-a%d", r.Sample, r.Attempt) }

// FileName is the name of the complete dump for this RID.
func (r RID) FileName() string { return r.String() + DumpSuffix }

// ParseRID parses a RID string; anything not matching the pattern is an error.
func ParseRID(s string) (RID, error) {
	m := ridPattern.FindStringSubmatch(s)
	if m == nil {
		return RID{}, fmt.Errorf("rid %q does not match s<9 digits>-a<attempt>", s)
	}
	sample, _ := strconv.Atoi(m[1])
	attempt, _ := strconv.Atoi(m[2])
	return RID{Sample: sample, Attempt: attempt}, nil
}

// ParseDumpName returns the RID of a complete dump's file name, and false for any other
// name (partials, temp files, foreign files).
func ParseDumpName(name string) (RID, bool) {
	if len(name) <= len(DumpSuffix) || name[len(name)-len(DumpSuffix):] != DumpSuffix {
		return RID{}, false
	}
	r, err := ParseRID(name[:len(name)-len(DumpSuffix)])
	return r, err == nil
}
