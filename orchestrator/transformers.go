package orchestrator

import (
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/sglang"
)

// transformersSpec is server.transformers as the launch spec takes it.
func transformersSpec(cfg *configs.Config) sglang.TransformersSpec {
	t := cfg.Server.Transformers
	return sglang.TransformersSpec{MaxBatchTokens: t.MaxBatchTokens, MaxBatchRequests: t.MaxBatchRequests,
		Dtype: t.Dtype, AttnImplementation: t.AttnImplementation}
}
