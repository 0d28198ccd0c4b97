package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/doctor"
)

// The incident's script was kept in /tmp and lost at the reboot: a config there must
// show up in the triage, beside the binary that a cron line would run.
func TestDoctorCommandChecksWhereTheConfigFileAndTheBinaryLive(t *testing.T) {
	dir := t.TempDir() // under /tmp
	shmDir, err := os.MkdirTemp("/dev/shm", "doctor-cmd-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(shmDir) })
	if err := os.WriteFile(filepath.Join(dir, "data.jsonl"), []byte(`{"input_ids":[1,2,3]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "job.yaml")
	yaml := "dataset: data.jsonl\noutput_dir: out\nshm_dir: " + shmDir + "\nserver:\n  kind: simulator\n  port: 30119\n  layers: [2, 30, 58]\n  simulator:\n    hidden_size: 64\n"
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := configs.Load(file, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer

	err = runDoctor(context.Background(), cfg, doctorOptions{configFile: file, json: true}, &out)

	var rep doctor.Report
	if jerr := json.Unmarshal(out.Bytes(), &rep); jerr != nil {
		t.Fatalf("doctor --json printed no report (%v; run error %v):\n%s", jerr, err, out.String())
	}
	checks := map[string]doctor.Check{}
	for _, c := range rep.Checks {
		checks[c.Name] = c
	}
	if c := checks["config file"]; c.Status != doctor.CheckWarn || !strings.Contains(c.Reason, file+" is under /tmp") {
		t.Errorf("config file check = %+v; want a warning that %s is under /tmp", c, file)
	}
	if c, ok := checks["executable"]; !ok || c.Reason == "" {
		t.Errorf("no executable check in %s", out.String())
	}
}
