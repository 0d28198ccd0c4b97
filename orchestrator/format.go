package orchestrator

import (
	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
)

// outputLayout is where and in which format the job writes its outputs. The config has
// been validated, so the layout's own check cannot fail; should it, the zero format
// (safetensors) is what Layout falls back to and the index's output_format says so.
func outputLayout(cfg *configs.Config) checkpoint.Layout {
	l, err := checkpoint.ParseLayout(cfg.OutputDir, cfg.Output.LayoutName())
	if err != nil {
		return checkpoint.Layout{Dir: cfg.OutputDir}
	}
	return l
}
