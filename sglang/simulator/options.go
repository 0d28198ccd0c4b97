package simulator

import (
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Options are what a job may set on the simulator: its width, its prefill rate, the
// faults tests inject and the shape of generated replies. They are declared once, here:
// the config reads them as the server.simulator keys (the mapstructure tags), the launch
// spec carries them (sglang.SimulatorSpec), and they reach the simulate command as the
// flags that Args writes and bindFlags reads.
type Options struct {
	// TokensPerSecond is one prefill rate shared by all requests, like one GPU queue;
	// 0 runs as fast as it can.
	TokensPerSecond float64 `mapstructure:"tokens_per_second"`
	HiddenSize      int     `mapstructure:"hidden_size"`
	// StartupDelay is how long /health_generate and /generate answer 503, like a model loading.
	StartupDelay time.Duration `mapstructure:"startup_delay"`
	// ExitAfter makes the process exit with status 3 after that many completed requests.
	ExitAfter int `mapstructure:"exit_after"`
	// HangAfter makes /generate and /health_generate block after that many completed
	// requests, like a stuck scheduler behind a live HTTP frontend.
	HangAfter int `mapstructure:"hang_after"`
	// Fail503Every answers every Nth /generate with 503 before doing any work.
	Fail503Every int `mapstructure:"fail_503_every"`
	// CorruptEvery writes every Nth dump with input_ids that differ from the request's,
	// as a server that tokenized or cached wrongly would.
	CorruptEvery int `mapstructure:"corrupt_every"`
	// LateDumpDelay writes each dump this long after the response, like a slow hook.
	LateDumpDelay time.Duration `mapstructure:"late_dump_delay"`
	// DecodeDelay is the time to generate each token after the first: the answer comes
	// (max_new_tokens − 1) × DecodeDelay after the dump, as SGLang's hook dumps at the
	// end of the prefill and answers after decoding.
	DecodeDelay time.Duration `mapstructure:"decode_delay"`
	// RequestLog, when set, is a file that gets one line per /generate received ("rid port
	// open", open being the requests under way with this one), appended across restarts
	// and shared by replicas (O_APPEND, one write a line): tests count the work the
	// server was asked to do, and how much of it at once.
	RequestLog string `mapstructure:"request_log"`
	// CrashOnSamples makes the process exit with status 3 as soon as a request for one
	// of these samples (by its rid, s<sample>-a<attempt>) arrives: a prompt that kills
	// the server, and every request in flight with it, as a batch holding it would
	// (tests of the poison rule).
	CrashOnSamples []int `mapstructure:"crash_on_samples"`
	// Gen shapes the replies to extract generate's requests (generate.go); its keys sit
	// in server.simulator itself.
	Gen GenConfig `mapstructure:",squash"`
	// CrashOnRID makes the process exit (status 3) when a generation request whose rid
	// starts with one of these arrives: a prompt that kills the server every time.
	CrashOnRID []string `mapstructure:"crash_on_rid"`
}

// bindFlags registers one flag per option, with the names Args writes.
func (o *Options) bindFlags(fs *pflag.FlagSet) {
	fs.IntVar(&o.HiddenSize, "hidden-size", 64, "hidden size H of every captured layer")
	fs.Float64Var(&o.TokensPerSecond, "tokens-per-second", 0, "global prefill rate (0: unlimited)")
	fs.DurationVar(&o.StartupDelay, "startup-delay", 0, "how long /health_generate answers 503 at start")
	fs.IntVar(&o.ExitAfter, "exit-after", 0, "fault: exit with status 3 after N completed requests")
	fs.IntVar(&o.HangAfter, "hang-after", 0, "fault: hang /generate and /health_generate after N completed requests")
	fs.IntVar(&o.Fail503Every, "fail-503-every", 0, "fault: answer every Nth /generate with 503")
	fs.IntVar(&o.CorruptEvery, "corrupt-every", 0, "fault: write every Nth dump with input_ids that differ from the request's")
	fs.DurationVar(&o.LateDumpDelay, "late-dump-delay", 0, "fault: write each dump this long after answering")
	fs.DurationVar(&o.DecodeDelay, "decode-delay", 0, "time per generated token after the first, between the dump and the answer")
	fs.StringVar(&o.RequestLog, "request-log", "", "append \"rid port open\" of every /generate received to this file")
	fs.IntSliceVar(&o.CrashOnSamples, "crash-on-samples", nil, "fault: exit with status 3 when a request for one of these samples arrives")
	fs.IntVar(&o.Gen.ReplyTokens, "gen-reply-tokens", 0, "most content bytes of a generated reply (0: 24)")
	fs.IntVar(&o.Gen.EmptyEvery, "gen-empty-every", 0, "about one generated reply in N is empty")
	fs.IntVar(&o.Gen.ThinkEvery, "gen-think-every", 0, "about one generated reply in N carries a think marker")
	fs.IntVar(&o.Gen.ContextLength, "gen-context-length", 0, "refuse a generation prompt longer than this with 400 (0: no bound)")
	fs.StringSliceVar(&o.CrashOnRID, "crash-on-rid", nil, "fault: exit with status 3 when a generation rid with this prefix arrives")
}

// Args are the flags that give the simulate command these options, but for HiddenSize,
// which the launch spec writes beside the model's other dimensions. The rate and the
// startup delay are always written, every other option only when set, so that a
// server's argv (and so its launch fingerprint) names only the faults it runs with.
func (o Options) Args() []string {
	args := []string{
		"--tokens-per-second", strconv.FormatFloat(o.TokensPerSecond, 'g', -1, 64),
		"--startup-delay", o.StartupDelay.String(),
	}
	for _, f := range []struct {
		name string
		set  bool
		val  string
	}{
		{"--exit-after", o.ExitAfter != 0, strconv.Itoa(o.ExitAfter)},
		{"--hang-after", o.HangAfter != 0, strconv.Itoa(o.HangAfter)},
		{"--fail-503-every", o.Fail503Every != 0, strconv.Itoa(o.Fail503Every)},
		{"--corrupt-every", o.CorruptEvery != 0, strconv.Itoa(o.CorruptEvery)},
		{"--late-dump-delay", o.LateDumpDelay != 0, o.LateDumpDelay.String()},
		{"--decode-delay", o.DecodeDelay != 0, o.DecodeDelay.String()},
		{"--request-log", o.RequestLog != "", o.RequestLog},
		{"--crash-on-samples", len(o.CrashOnSamples) > 0, joinInts(o.CrashOnSamples)},
		{"--gen-reply-tokens", o.Gen.ReplyTokens != 0, strconv.Itoa(o.Gen.ReplyTokens)},
		{"--gen-empty-every", o.Gen.EmptyEvery != 0, strconv.Itoa(o.Gen.EmptyEvery)},
		{"--gen-think-every", o.Gen.ThinkEvery != 0, strconv.Itoa(o.Gen.ThinkEvery)},
		{"--gen-context-length", o.Gen.ContextLength != 0, strconv.Itoa(o.Gen.ContextLength)},
		{"--crash-on-rid", len(o.CrashOnRID) > 0, strings.Join(o.CrashOnRID, ",")},
	} {
		if f.set {
			args = append(args, f.name, f.val)
		}
	}
	return args
}

// negative reports whether a rate, count or delay is below zero.
func (o Options) negative() bool {
	g := o.Gen
	return o.TokensPerSecond < 0 || o.ExitAfter < 0 || o.HangAfter < 0 || o.Fail503Every < 0 || o.CorruptEvery < 0 ||
		g.ReplyTokens < 0 || g.EmptyEvery < 0 || g.ThinkEvery < 0 || g.ContextLength < 0 ||
		o.StartupDelay < 0 || o.LateDumpDelay < 0 || o.DecodeDelay < 0
}
