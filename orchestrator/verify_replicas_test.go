package orchestrator

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/extract-dev/extract/checkpoint"
)

func TestRebuildTakesAnAttemptBaseAboveTheAttemptsInEveryReplicasStagingDir(t *testing.T) {
	j := newVerifyJob(t)
	j.output(0, 3)
	j.cfg.Server.Replicas = 2
	// Replica 1's dir, and a dir of a replica this config no longer has: both are traces.
	j.touch(filepath.Join(j.cfg.ShmDir, "r1", "s000000002-a9.safetensors.partial"))
	j.touch(filepath.Join(j.cfg.ShmDir, "r5", "s000000001-a11.safetensors"))

	res, err := Verify(context.Background(), j.cfg, checkpoint.VerifyOptions{Repair: true})
	if err != nil {
		t.Fatal(err)
	}
	if rb := res.Rebuild; rb == nil || rb.AttemptBase != 11+j.cfg.Run.MaxAttempts {
		t.Fatalf("rebuild = %+v; want attempt base 11 + run.max_attempts", rb)
	}
}
