package orchestrator

import (
	"context"
	"math"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/dataset"
	"github.com/extract-dev/extract/doctor"
)

// Doctor is doctor.Run given the run loop's facts about the job (doctor.JobFacts): the
// lock's holder, run.json, the output layout, admission's sample size, the launch spec.
func Doctor(ctx context.Context, cfg *configs.Config, opt doctor.Options) (doctor.Report, error) {
	opt.Job = doctor.JobFacts{
		LockHolder: func() (doctor.Holder, bool) {
			h, held := LockHolder(cfg.StateDir)
			return doctor.Holder{PID: h.PID, Run: h.IsRun(), Name: h.String()}, held
		},
		RunStatusAddr: func(pid int) (string, bool) {
			ri, err := readRunInfo(cfg.StateDir)
			return ri.StatusAddr, err == nil && ri.PID == pid
		},
		OutputFiles: func(ds *dataset.Dataset) (int, error) {
			span := shardSpan{0, math.MaxInt}
			if ds != nil {
				span = spanOf(cfg, ds.Len())
			}
			return jobFiles(cfg, span)
		},
		SampleBytes:        func(tokens int) int64 { return sampleBytes(cfg, tokens) },
		CheckConversations: func() error { return checkConversationJob(cfg) },
		Launch:             launchSpec(cfg, ""),
	}
	return doctor.Run(ctx, cfg, opt)
}
