package checkpoint

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/extract-dev/extract/internal/testsupport"
)

// torchLayouts are the formats a trainer loads through torch.
var torchLayouts = []Layout{
	{Format: FormatSpecForge}, {Format: FormatSpecForge, Gzip: true}, {Format: FormatModelOpt},
}

// moveAll moves the same dumps into a safetensors reference dir and one dir per torch
// layout, returning the dirs by layout name.
func moveAll(t *testing.T, samples []int, T int64) map[string]string {
	t.Helper()
	root := t.TempDir()
	dumps := t.TempDir()
	dirs := map[string]string{}
	for _, l := range append([]Layout{{Format: FormatSafetensors}}, torchLayouts...) {
		l.Dir = filepath.Join(root, strings.ReplaceAll(l.Name(), "+", "_"))
		dirs[l.Name()] = l.Dir
		m := &Mover{Layout: l}
		for _, s := range samples {
			path := writeDump(t, dumps, dumpSpec{sample: s, T: T})
			want := expectFor(s, T)
			want.LossMask = make([]int64, T)
			for i := range want.LossMask {
				want.LossMask[i] = int64(i % 2)
			}
			moved, err := m.moveFile(context.Background(), path, want)
			if err != nil {
				t.Fatalf("%s: move sample %d: %v", l.Name(), s, err)
			}
			if moved.Path != l.Path(s) {
				t.Fatalf("%s: moved to %s, want %s", l.Name(), moved.Path, l.Path(s))
			}
			info, err := readOutput(context.Background(), moved.Path, true, &fileWant{ids: want.InputIDs, mask: want.LossMask, haveIDs: true, haveSample: true, hidden: 8, layers: "2,30,58"}, make([]byte, 4096))
			if err != nil {
				t.Fatalf("%s: read back sample %d: %v", l.Name(), s, err)
			}
			if info.CRC32C != moved.CRC32C || info.Bytes != moved.Bytes || info.Sample != s || info.HiddenSize != 8 || info.Tokens != int(T) {
				t.Fatalf("%s: read back %+v, moved %+v", l.Name(), info, moved)
			}
		}
	}
	return dirs
}

func TestEveryFormatCarriesTheSameCRC32COfTheSameTensors(t *testing.T) {
	dirs := moveAll(t, []int{0, 2001}, 37)
	var sums []uint32
	for name, dir := range dirs {
		l, _ := ParseLayout(dir, name)
		info, err := ReadOutput(l.Path(2001), true)
		if err != nil {
			t.Fatal(err)
		}
		sums = append(sums, info.CRC32C)
	}
	for _, s := range sums {
		if s != sums[0] {
			t.Fatalf("crc32c differ between formats: %08x", sums)
		}
	}
}

// python is Debian's interpreter with python3-torch; tests skip without it.
func python(t *testing.T) string {
	t.Helper()
	testsupport.Require(t, testsupport.Torch)
	return "/usr/bin/python3"
}

// specforgeSrc is SpecForge's reader code beside the project, or "" when absent.
func specforgeSrc(t *testing.T) string {
	src, _ := filepath.Abs("../../shared/specforge-src")
	if _, err := os.Stat(filepath.Join(src, "specforge/runtime/data_plane/offline_reader.py")); err != nil {
		t.Logf("SpecForge source absent at %s: its reader is not run", src)
		return ""
	}
	return src
}

func TestRealTorchAndSpecForgeLoadGoWrittenFilesByteForByte(t *testing.T) {
	py := python(t)
	dirs := moveAll(t, []int{0, 1, 1999, 2000, 4321}, 300)
	src := specforgeSrc(t)
	for _, l := range torchLayouts {
		args := []string{"../scripts/check_torch_formats.py", dirs[l.Name()], "--reference", dirs["safetensors"]}
		if src != "" && l.Format == FormatSpecForge {
			args = append(args, "--specforge", src, "--collate", "3")
		}
		out, err := exec.Command(py, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: check_torch_formats: %v\n%s", l.Name(), err, out)
		}
		var sum struct {
			Files          int `json:"files"`
			SpecforgeFiles int `json:"specforge_files"`
			OK             bool
		}
		if err := json.Unmarshal(out, &sum); err != nil || !sum.OK || sum.Files != 5 {
			t.Fatalf("%s: summary %s (%v)", l.Name(), out, err)
		}
		if src != "" && l.Format == FormatSpecForge && sum.SpecforgeFiles != 5 {
			t.Fatalf("%s: SpecForge found %d files, want 5\n%s", l.Name(), sum.SpecforgeFiles, out)
		}
		t.Logf("%s: %s", l.Name(), out)
	}
}

func TestASingleTokenSampleReadsBackInEveryFormat(t *testing.T) {
	dirs := moveAll(t, []int{5}, 1)
	for name, dir := range dirs {
		l, _ := ParseLayout(dir, name)
		if info, err := ReadOutput(l.Path(5), true); err != nil || info.Tokens != 1 || info.HiddenSize != 8 {
			t.Fatalf("%s: %+v, %v", name, info, err)
		}
	}
}

func TestMovingA64MiBDumpIntoTorchFormatsKeepsTheHeapFlat(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 128 MiB per format")
	}
	dumpPath := writeDump(t, t.TempDir(), dumpSpec{sample: 5, T: 1024, H: 8192})
	want := expectFor(5, 1024)
	want.HiddenSize = 8192
	for _, l := range torchLayouts {
		l.Dir = t.TempDir()
		m := &Mover{Layout: l}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		moved, err := m.moveFile(context.Background(), dumpPath, want)
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatal(err)
		}
		alloc := after.TotalAlloc - before.TotalAlloc
		t.Logf("%s: moving %d MiB of dump allocated %d KiB", l.Name(), moved.Bytes>>20, alloc>>10)
		if alloc > 16<<20 {
			t.Fatalf("%s: allocated %d bytes; want under 16 MiB", l.Name(), alloc)
		}
	}
}
