package configs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// loadErr loads body as a config file and returns the error text, failing the test when
// the config is accepted or the error is not ErrInvalid.
func loadErr(t *testing.T, body string, flags []Flag) (string, string) {
	t.Helper()
	path := writeConfig(t, body)
	_, err := Load(path, flags)
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("err = %v, want ErrInvalid", err)
	}
	return err.Error(), path
}

func wantAll(t *testing.T, msg string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(msg, w) {
			t.Errorf("error %q does not say %q", msg, w)
		}
	}
}

func TestAnEmptyEnvValueIsAnErrorNamingTheVariable(t *testing.T) {
	for _, name := range []string{"EXTRACT_OUTPUT_DIR", "EXTRACT_DATASET", "EXTRACT_SERVER_PORT", "EXTRACT_CONFIG"} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(name, "")
			_, err := Load(writeConfig(t, minimal), nil)
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v; an empty %s was taken (a relative output_dir would move to the working directory)", err, name)
			}
			wantAll(t, err.Error(), name, "empty")
		})
	}
}

func TestAYAMLKeyTypoNamesTheLineAndTheNearestKey(t *testing.T) {
	msg, path := loadErr(t, minimal+"  prot: 1\n", nil)
	wantAll(t, msg, path+":6:", "server.prot", "did you mean server.port?")
	if strings.Contains(msg, "has invalid keys") {
		t.Errorf("error %q is mapstructure's raw text", msg)
	}
}

func TestATopLevelTypoNamesTheKeyNotAnEmptyName(t *testing.T) {
	msg, path := loadErr(t, "dataset: d\noutput_dir: o\nservr:\n  kind: simulator\n", nil)
	wantAll(t, msg, path+":3:", "unknown key servr", "did you mean server?")
	if strings.Contains(msg, "''") {
		t.Errorf("error %q names the top level as ''", msg)
	}
}

func TestAKeyUnderTheWrongSectionFindsItsSection(t *testing.T) {
	msg, _ := loadErr(t, minimal+"port: 30001\n", nil)
	wantAll(t, msg, "unknown key port", "did you mean server.port?")
}

func TestAKeyFarFromEveryKeyListsTheSectionsKeys(t *testing.T) {
	msg, _ := loadErr(t, minimal+"disk:\n  zzzzzzzzzzzz: 1\n", nil)
	wantAll(t, msg, "unknown key disk.zzzzzzzzzzzz", "reserve", "when_short")
}

func TestAnEnvValueIsBlamedOnTheEnvVariableNotTheFile(t *testing.T) {
	t.Setenv("EXTRACT_SERVER_PORT", "99999")
	msg, path := loadErr(t, minimal+"  port: 30001\n", nil)
	wantAll(t, msg, "env EXTRACT_SERVER_PORT=99999", "server.port", "99999")
	if strings.Contains(msg, path) {
		t.Errorf("error %q blames the file %s for the env value", msg, path)
	}
}

func TestAFileValueIsBlamedOnItsLine(t *testing.T) {
	msg, path := loadErr(t, minimal+"  port: 99999\n", nil)
	wantAll(t, msg, path+":6: server.port", "99999")
}

func TestAFlagValueIsBlamedOnTheFlag(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	fs.String("status-listen", "", "")
	if err := fs.Parse([]string{"--status-listen=nowhere"}); err != nil {
		t.Fatal(err)
	}
	msg, _ := loadErr(t, minimal, []Flag{{Key: "status.listen", Flag: fs.Lookup("status-listen")}})
	wantAll(t, msg, "flag --status-listen=nowhere", "status.listen")
}

func TestABadDurationShowsTheValueAndItsSource(t *testing.T) {
	msg, path := loadErr(t, minimal+"run:\n  dump_timeout: 5 minutes\n", nil)
	wantAll(t, msg, path+":7: run.dump_timeout", `"5 minutes"`)

	t.Setenv("EXTRACT_RUN_DUMP_TIMEOUT", "soon")
	msg, _ = loadErr(t, minimal, nil)
	wantAll(t, msg, "env EXTRACT_RUN_DUMP_TIMEOUT=soon", "run.dump_timeout", `"soon"`)
}

func TestAUnitlessDurationIsRefused(t *testing.T) {
	// Decoded as is, 300 is 300ns: a startup timeout that gives up at once.
	msg, path := loadErr(t, minimal+"  startup_timeout: 300\n", nil)
	wantAll(t, msg, path+":6: server.startup_timeout", "300", "no unit")

	t.Setenv("EXTRACT_RUN_DUMP_TIMEOUT", "300")
	msg, _ = loadErr(t, minimal, nil)
	wantAll(t, msg, "env EXTRACT_RUN_DUMP_TIMEOUT=300", "run.dump_timeout")
}

func TestAZeroDurationNeedsNoUnit(t *testing.T) {
	c, err := Load(writeConfig(t, minimal+"run:\n  drain_timeout: 0\n"), nil)
	if err != nil || c.Run.DrainTimeout != 0 {
		t.Fatalf("drain_timeout 0: %v, %v", c, err)
	}
}

func TestAWrongTypeNamesTheKeyValueAndLine(t *testing.T) {
	msg, path := loadErr(t, minimal+"run:\n  movers: many\n", nil)
	wantAll(t, msg, path+":7: run.movers", "integer", `"many"`)
}

func TestASectionGivenAValueIsRefusedWithItsKeys(t *testing.T) {
	msg, path := loadErr(t, "dataset: d\noutput_dir: o\nserver:\n  kind: simulator\nrun: fast\n", nil)
	wantAll(t, msg, path+":5:", "run is a section", "max_inflight")
}

func TestAValidationErrorWithoutAValueInItsTextGetsTheValue(t *testing.T) {
	msg, path := loadErr(t, minimal+"log:\n  level: chatty\n", nil)
	wantAll(t, msg, path+":7: log.level", `"chatty"`)
}

func TestServerEnvTakesAnyNames(t *testing.T) {
	if _, err := Load(writeConfig(t, minimal+"  env:\n    HF_HOME: /x\n    ANY_NAME_AT_ALL: y\n"), nil); err != nil {
		t.Fatal(err)
	}
}

func TestTheShippedConfigsHaveNoUnknownKeys(t *testing.T) {
	files, _ := filepath.Glob("*.yaml")
	if len(files) == 0 {
		t.Fatal("no shipped configs found")
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, errs := readFileKeys(f, data, shapeOf(Default())); len(errs) > 0 {
			t.Errorf("%s: %v", f, errors.Join(errs...))
		}
	}
}
