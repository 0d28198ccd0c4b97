package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"image"
	"image/png"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/extract-dev/extract/internal/history"
	"github.com/extract-dev/extract/internal/testsupport"
)

var updateDocs = flag.Bool("update-docs", false, "copy the report's screenshot to docs/report.png")

// chromium is Debian's chromium; without it the test skips, or fails where CI requires
// the kind (`apt-get install -y chromium`).
func chromium(t *testing.T) string {
	t.Helper()
	testsupport.Require(t, testsupport.Chromium)
	return testsupport.ChromiumPath()
}

// headless runs chromium on a page with every network path closed: a proxy on a dead
// port, no background services. It returns chromium's stdout and the URLs the page
// itself asked for, read from chromium's own net log (requests that chromium's
// services start are "not an origin"; a page's carry its origin, "null" for file://).
func headless(t *testing.T, bin, page string, args ...string) (string, []string) {
	t.Helper()
	dir := t.TempDir()
	netlog := filepath.Join(dir, "net.json")
	base := []string{"--headless", "--no-sandbox", "--disable-gpu", "--user-data-dir=" + filepath.Join(dir, "profile"),
		"--proxy-server=http://127.0.0.1:9", "--disable-background-networking", "--disable-component-update",
		"--disable-sync", "--no-first-run", "--disable-extensions", "--log-net-log=" + netlog}
	cmd := exec.Command(bin, append(append(base, args...), "file://"+page)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", args, err, errb.String())
	}
	var log struct {
		Constants struct {
			LogEventTypes map[string]int `json:"logEventTypes"`
		} `json:"constants"`
		Events []struct {
			Type   int `json:"type"`
			Params struct {
				URL       string `json:"url"`
				Initiator string `json:"initiator"`
			} `json:"params"`
		} `json:"events"`
	}
	if err := json.Unmarshal([]byte(mustRead(t, netlog)), &log); err != nil {
		t.Fatalf("chromium's net log: %v", err)
	}
	start, ok := log.Constants.LogEventTypes["URL_REQUEST_START_JOB"]
	if !ok {
		t.Fatal("chromium's net log names no URL_REQUEST_START_JOB: cannot tell what the page fetched")
	}
	var fetched []string
	for _, e := range log.Events {
		if e.Type == start && e.Params.URL != "" && e.Params.Initiator != "not an origin" {
			fetched = append(fetched, e.Params.URL)
		}
	}
	return out.String(), fetched
}

// TestTheReportOfATwoReplicaJobWithRestartsAndAPauseLoadsInChromiumWithNoNetwork runs a
// job of two simulator replicas, kills both servers at once (each is restarted, and
// admission pauses while no server is ready), then renders `extract report` in
// headless chromium: the page must load without one fetch, and its SVG must mark the
// restarts, the pause and both replicas. The live endpoint serves the same page.
func TestTheReportOfATwoReplicaJobWithRestartsAndAPauseLoadsInChromiumWithNoNetwork(t *testing.T) {
	bin := chromium(t)
	j := newJob(t, 500, 2000)
	j.withReplicas(2)
	j.env = append(j.env, "EXTRACT_SERVER_SIMULATOR_STARTUP_DELAY=2s")
	_, wait := j.start("run")
	j.waitStatus("two ready replicas", allReady(2))
	st := j.waitStatus("progress on both", func(st map[string]any) bool {
		return num(st["done"]) > 60 && num(servers(st)[0]["done"]) > 0 && num(servers(st)[1]["done"]) > 0
	})
	for _, s := range servers(st) {
		if err := syscall.Kill(-num(s["pid"]), syscall.SIGKILL); err != nil {
			t.Fatalf("kill replica %v's server group: %v", s["replica"], err)
		}
	}
	j.waitStatus("admission paused with no server ready", func(st map[string]any) bool { return paused(st, "no server ready") })
	j.waitStatus("both replicas restarted", func(st map[string]any) bool {
		ss := servers(st)
		return num(ss[0]["restarts"]) == 1 && num(ss[1]["restarts"]) == 1 && allReady(2)(st)
	})
	checkLiveReport(t, j)
	live := filepath.Join(j.dir, "live.png")
	if r := j.run("report", "--out", live); r.code != 0 {
		t.Fatalf("report of the running job: exit %d\n%s", r.code, r.stderr)
	}
	decodePNG(t, live)
	if code, stderr := wait(); code != 0 {
		t.Fatalf("run exit %d\n%s", code, stderr)
	}
	j.requireExact()

	page := filepath.Join(j.dir, "report.html")
	if r := j.run("report", "--out", page); r.code != 0 {
		t.Fatalf("report exit %d\n%s", r.code, r.stderr)
	}
	dom, fetched := headless(t, bin, page, "--dump-dom")
	if len(fetched) > 0 {
		t.Errorf("the page fetched %v", fetched)
	}
	if !strings.Contains(dom, "</svg>") {
		t.Fatalf("chromium's DOM has no SVG:\n%.2000s", dom)
	}
	count := func(pattern string) int { return len(regexp.MustCompile(pattern).FindAllString(dom, -1)) }
	const panels = 6
	for _, c := range []struct {
		what, pattern string
		min           int
	}{
		{"restart marks of replica 0", `<g class="event event-restart" data-replica="0"`, panels},
		{"restart marks of replica 1", `<g class="event event-restart" data-replica="1"`, panels},
		{"pause bands", `<g class="event event-pause"[^>]*><title>paused: [^<]*no server ready`, panels},
		{"run start marks", `<g class="event event-run"`, panels},
		{"replica 0's rate", `class="series series-replica series-replica-0"`, 1},
		{"replica 1's rate", `class="series series-replica series-replica-1"`, 1},
		{"event table rows of restarts", `<tr class="event-row event-row-restart">`, 2},
	} {
		if n := count(c.pattern); n < c.min {
			t.Errorf("%s: %d in the rendered page, want at least %d", c.what, n, c.min)
		}
	}

	// The checker sees a fetch when there is one: the same page without its CSP and
	// with one stylesheet from elsewhere.
	leak := filepath.Join(j.dir, "leak.html")
	b := regexp.MustCompile(`<meta http-equiv="Content-Security-Policy"[^>]*>`).ReplaceAllString(mustRead(t, page), `<link rel="stylesheet" href="http://example.invalid/leak.css">`)
	os.WriteFile(leak, []byte(b), 0o644)
	if _, fetched := headless(t, bin, leak, "--dump-dom"); len(fetched) != 1 || !strings.Contains(fetched[0], "example.invalid/leak.css") {
		t.Errorf("the net log check missed a page's fetch: %v", fetched)
	}

	shot := filepath.Join(j.dir, "report.png")
	headless(t, bin, page, "--screenshot="+shot, "--window-size=1040,1700", "--hide-scrollbars")
	img := decodePNG(t, shot)
	if red := countPixels(img, func(r, g, b uint32) bool { return r > 0xc0 && g < 0x60 && b < 0x60 }); red < 200 {
		t.Errorf("the screenshot has %d red pixels: the restart lines are not drawn", red)
	}
	if *updateDocs {
		os.WriteFile(filepath.Join("..", "..", "docs", "report.png"), []byte(mustRead(t, shot)), 0o644)
	}
	if d, err := history.ReadFile(filepath.Join(j.state, history.FileName)); err != nil || d.Torn+d.Skipped > 0 {
		t.Errorf("the run's history: %+v, %v", d, err)
	}
}

// checkLiveReport reads /report and /report.png from the running job's endpoint.
func checkLiveReport(t *testing.T, j *job) {
	t.Helper()
	var ri struct {
		StatusAddr string `json:"status_addr"`
	}
	if err := json.Unmarshal([]byte(mustRead(t, filepath.Join(j.state, "run.json"))), &ri); err != nil {
		t.Fatal(err)
	}
	get := func(path string) (*http.Response, []byte) {
		resp, err := http.Get("http://" + ri.StatusAddr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, body
	}
	// The history records a restart within a second or so of the run seeing it.
	resp, body := get("/report")
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline) && !bytes.Contains(body, []byte(`class="event event-restart"`)); {
		time.Sleep(200 * time.Millisecond)
		resp, body = get("/report")
	}
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") ||
		!strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'none'") || !bytes.Contains(body, []byte(`class="event event-restart"`)) {
		t.Errorf("/report: %s %v\n%.500s", resp.Status, resp.Header, body)
	}
	resp, body = get("/report.png")
	if _, err := png.Decode(bytes.NewReader(body)); resp.StatusCode != 200 || err != nil {
		t.Errorf("/report.png: %s, %v", resp.Status, err)
	}
	post, err := http.Post("http://"+ri.StatusAddr+"/report", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	post.Body.Close()
	if post.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /report: %s, want 405: the endpoint is read-only", post.Status)
	}
}

func decodePNG(t *testing.T, path string) image.Image {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return img
}

func countPixels(img image.Image, match func(r, g, b uint32) bool) int {
	n := 0
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			r, g, bl, _ := img.At(x, y).RGBA()
			if match(r>>8, g>>8, bl>>8) {
				n++
			}
		}
	}
	return n
}

// TestReportAllAddsUpTheShardsHistoriesAndStatusWatchDrawsASparklineOnATerminal runs a
// job of two shards side by side, then draws `report --all` (both shards' replicas,
// both runs) and one shard's report, and watches a shard's status on a terminal.
func TestReportAllAddsUpTheShardsHistoriesAndStatusWatchDrawsASparklineOnATerminal(t *testing.T) {
	const n, samples = 2, 120
	j := newJob(t, samples, 3000)
	t.Cleanup(func() { j.stopShardServers(n) })
	errs := make(chan string, n)
	for i := range n {
		go func() {
			cmd := j.command("run", "--resume", "--shard", fmt.Sprintf("%d/%d", i, n))
			cmd.Env = j.shardEnv(t)
			out, err := cmd.CombinedOutput()
			if err != nil {
				errs <- fmt.Sprintf("shard %d: %v\n%s", i, err, out)
				return
			}
			errs <- ""
		}()
	}
	for range n {
		if e := <-errs; e != "" {
			t.Fatal(e)
		}
	}
	page := filepath.Join(j.dir, "all.html")
	if r := j.run("report", "--all", "--out", page); r.code != 0 {
		t.Fatalf("report --all: exit %d\n%s", r.code, r.stderr)
	}
	html := mustRead(t, page)
	for _, want := range []string{"2 shards", "120 / 120 samples (100.0%)", "state complete",
		`class="series series-replica series-replica-0"`, `class="series series-replica series-replica-1"`,
		"shard 0 replica 0", "shard 1 replica 0", "shard 0: run started", "shard 1: run started"} {
		if !strings.Contains(html, want) {
			t.Errorf("report --all lacks %q", want)
		}
	}
	if r := j.run("report", "--all", "--out", filepath.Join(j.dir, "all.png")); r.code != 0 {
		t.Fatalf("report --all --out .png: exit %d\n%s", r.code, r.stderr)
	}
	decodePNG(t, filepath.Join(j.dir, "all.png"))
	one := j.run("report", "--shard", "1/2")
	if one.code != 0 || !strings.Contains(one.stdout, "shard 1 of 2") || !strings.Contains(one.stdout, "60 / 60 samples") {
		t.Fatalf("report --shard 1/2: exit %d\n%.600s\n%s", one.code, one.stdout, one.stderr)
	}
	if r := j.run("report", "--out", "report.pdf"); r.code != 2 {
		t.Errorf("report --out report.pdf: exit %d, want 2", r.code)
	}

	// status --watch on a terminal: the sparkline of the last minutes' rate.
	ptm, pts := openPTY(t, 160)
	cmd := j.command("status", "--watch", "300ms", "--shard", "0/2")
	cmd.Stdout, cmd.Stderr = pts, pts
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pts.Close()
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	var seen bytes.Buffer
	line := regexp.MustCompile(`rate, last [0-9hms]+: [ ▁▂▃▄▅▆▇█]*[▁▂▃▄▅▆▇█] *\(peak [0-9.]+ samples/s\)`)
	buf := make([]byte, 4096)
	deadline := time.Now().Add(20 * time.Second)
	for !line.Match(seen.Bytes()) {
		if time.Now().After(deadline) {
			t.Fatalf("status --watch on a terminal drew no sparkline:\n%s", seen.String())
		}
		ptm.SetReadDeadline(time.Now().Add(time.Second))
		k, _ := ptm.Read(buf)
		seen.Write(buf[:k])
	}
	// Not on a terminal: no sparkline (a pipe gets what scripts parse).
	piped := j.run("status", "--shard", "0/2")
	if strings.Contains(piped.stdout, "rate, last") {
		t.Errorf("status into a pipe drew a sparkline:\n%s", piped.stdout)
	}
}
