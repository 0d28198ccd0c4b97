package configs

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// Each server.simulator key a config file sets lands in its Simulator field, which the
// simulator reads as it is, and the section holds exactly the keys it always had (a
// renamed or dropped option would break configs written against the old name).
func TestEveryServerSimulatorKeyLandsInTheSimulatorsOptions(t *testing.T) {
	path := writeConfig(t, minimal+`  simulator:
    tokens_per_second: 1500.5
    hidden_size: 48
    startup_delay: 2s
    exit_after: 1
    hang_after: 2
    fail_503_every: 3
    corrupt_every: 4
    late_dump_delay: 5s
    decode_delay: 6ms
    request_log: /tmp/requests.log
    crash_on_samples: [7, 8]
    reply_tokens: 9
    empty_every: 10
    think_every: 11
    context_length: 12
    crash_on_rid: [g000000013]
`)
	c, err := Load(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := Simulator{
		TokensPerSecond: 1500.5, HiddenSize: 48, StartupDelay: 2 * time.Second,
		ExitAfter: 1, HangAfter: 2, Fail503Every: 3, CorruptEvery: 4,
		LateDumpDelay: 5 * time.Second, DecodeDelay: 6 * time.Millisecond,
		RequestLog: "/tmp/requests.log", CrashOnSamples: []int{7, 8},
		ReplyTokens: 9, EmptyEvery: 10, ThinkEvery: 11, ContextLength: 12,
		CrashOnRID: []string{"g000000013"},
	}
	if unset := zeroFields(reflect.ValueOf(want), ""); len(unset) > 0 {
		t.Fatalf("the test leaves options %v unset: give each a key above and a value here", unset)
	}
	if !reflect.DeepEqual(c.Server.Simulator, want) {
		t.Errorf("loaded %+v\nwant   %+v", c.Server.Simulator, want)
	}

	var keys []string
	for key := range flatten(Default()) {
		if rest, ok := strings.CutPrefix(key, "server.simulator."); ok {
			keys = append(keys, rest)
		}
	}
	slices.Sort(keys)
	wantKeys := []string{"context_length", "corrupt_every", "crash_on_rid", "crash_on_samples", "decode_delay",
		"empty_every", "exit_after", "fail_503_every", "hang_after", "hidden_size", "late_dump_delay",
		"reply_tokens", "request_log", "startup_delay", "think_every", "tokens_per_second"}
	if !slices.Equal(keys, wantKeys) {
		t.Errorf("server.simulator keys are %v, want %v", keys, wantKeys)
	}
}

// zeroFields names the fields of struct v (recursively) that hold their zero value.
func zeroFields(v reflect.Value, prefix string) []string {
	var out []string
	for i := 0; i < v.NumField(); i++ {
		f, name := v.Field(i), prefix+v.Type().Field(i).Name
		if f.Kind() == reflect.Struct {
			out = append(out, zeroFields(f, name+".")...)
		} else if f.IsZero() {
			out = append(out, name)
		}
	}
	return out
}
