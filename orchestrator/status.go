package orchestrator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/extract-dev/extract/checkpoint"
	"github.com/extract-dev/extract/configs"
	"github.com/extract-dev/extract/orchestrator/generate"
	"github.com/extract-dev/extract/sglang"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Status is what `extract status` shows, live from the running process or from the index.
type Status struct {
	State  string `json:"state"`  // running | stopped | complete
	Source string `json:"source"` // live | snapshot | index
	PID    int    `json:"pid,omitempty"`
	// LockHolder names the extract command other than a run that holds the lock
	// (verify, import, export), e.g. "extract verify (pid 42)"; no run is going then.
	LockHolder string `json:"lock_holder,omitempty"`
	Total      int    `json:"total"` // this run's samples: the shard's when sharded
	// DatasetSamples is the whole dataset's size, which a shard's range is cut from.
	DatasetSamples   int              `json:"dataset_samples,omitempty"`
	Done             int              `json:"done"`
	Imported         int              `json:"imported"` // of done: adopted by extract import, not computed
	Failed           int              `json:"failed"`
	Pending          int              `json:"pending"`
	Inflight         int              `json:"inflight"`
	BytesWritten     int64            `json:"bytes_written"`
	SamplesPerSecond float64          `json:"samples_per_second"`
	TokensPerSecond  float64          `json:"tokens_per_second"`
	BytesPerSecond   float64          `json:"bytes_per_second"`
	ETASeconds       float64          `json:"eta_seconds"` // -1 when unknown
	Paused           []string         `json:"paused"`
	Server           ServerStatus     `json:"server"`            // replica 0, as before replicas existed
	Servers          []ServerStatus   `json:"servers,omitempty"` // one per replica (server.replicas)
	GPUs             []GPUStatus      `json:"gpus,omitempty"`    // when NVML is there (server.kind sglang)
	Rejected         map[string]int64 `json:"rejected"`
	AdoptedDumps     int64            `json:"adopted_dumps"` // leftovers of an earlier run moved, not recomputed
	Dataset          string           `json:"dataset"`
	OutputDir        string           `json:"output_dir"`
	StartedAt        *time.Time       `json:"started_at,omitempty"`
	UpdatedAt        time.Time        `json:"updated_at"`
	Prepare          *PrepareStatus   `json:"prepare,omitempty"` // a conversation job's prepare step (conversations.go)
	// Generate is the generate stage (extract generate, generate.enabled), when one ran.
	Generate *generate.Status `json:"generate,omitempty"`
}

// ServerStatus describes one server (replica) the run drives.
type ServerStatus struct {
	Replica  int    `json:"replica"`
	State    string `json:"state"` // starting | ready | restarting | stopped
	PID      int    `json:"pid,omitempty"`
	Port     int    `json:"port,omitempty"`
	GPUs     []int  `json:"gpus,omitempty"` // server.kind sglang
	Adopted  bool   `json:"adopted"`
	Restarts int    `json:"restarts"`
	// Done counts the samples finished through it in this run.
	Done int `json:"done"`
	// Inflight and InflightTokens are the samples sent to it whose dump has not arrived.
	Inflight       int   `json:"inflight"`
	InflightTokens int64 `json:"inflight_tokens"`
	// HookVersion is the dump hook's version as the dumps report it.
	HookVersion string `json:"hook_version,omitempty"`
}

// GPUStatus is one GPU's load, sampled through NVML.
type GPUStatus struct {
	Index            int    `json:"index"`
	Name             string `json:"name"`
	MemoryUsedBytes  uint64 `json:"memory_used_bytes"`
	MemoryTotalBytes uint64 `json:"memory_total_bytes"`
	UtilizationPct   int    `json:"utilization_pct"` // -1 when NVML cannot say
	Processes        int    `json:"processes"`
}

// sampleGPUs reads the configured GPUs' memory and utilisation every interval into
// *dst until ctx ends; without NVML it logs once and stops.
func sampleGPUs(ctx context.Context, insp *sglang.GPUInspector, indices []int, interval time.Duration, dst *atomic.Pointer[[]GPUStatus], log *slog.Logger) {
	for {
		rep := insp.Inspect(indices)
		if !rep.Available {
			log.Info("no per-GPU status", "reason", rep.Reason)
			return
		}
		gpus := make([]GPUStatus, 0, len(rep.GPUs))
		for _, g := range rep.GPUs {
			gpus = append(gpus, GPUStatus{Index: g.Index, Name: g.Name, MemoryUsedBytes: g.MemoryUsed, MemoryTotalBytes: g.MemoryTotal, UtilizationPct: g.Utilization, Processes: len(g.Processes)})
		}
		dst.Store(&gpus)
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

// rateWindow is the span over which live rates are measured.
const rateWindow = 2 * time.Minute

// rateTracker turns cumulative counts into rates over the recent window.
type rateTracker struct {
	points []ratePoint
}

type ratePoint struct {
	at                    time.Time
	samples, tokens, byts int64
}

func (r *rateTracker) add(p ratePoint) {
	r.points = append(r.points, p)
	cut := 0
	for cut < len(r.points)-2 && p.at.Sub(r.points[cut].at) > rateWindow {
		cut++
	}
	r.points = r.points[cut:]
}

// rates is samples, tokens and bytes per second over the window.
func (r *rateTracker) rates() (float64, float64, float64) {
	if len(r.points) < 2 {
		return 0, 0, 0
	}
	a, b := r.points[0], r.points[len(r.points)-1]
	dt := b.at.Sub(a.at).Seconds()
	if dt <= 0 {
		return 0, 0, 0
	}
	return float64(b.samples-a.samples) / dt, float64(b.tokens-a.tokens) / dt, float64(b.byts-a.byts) / dt
}

// metrics are the Prometheus series of one run.
type metrics struct {
	reg          *prometheus.Registry
	total        prometheus.Gauge
	done         prometheus.Gauge
	failed       prometheus.Gauge
	inflight     prometheus.Gauge
	bytesWritten prometheus.Gauge
	rejected     *prometheus.CounterVec
	paused       *prometheus.GaugeVec
	moveSeconds  prometheus.Histogram
	restarts     *prometheus.CounterVec
	// Per server, by replica label.
	serverUp             *prometheus.GaugeVec
	serverInflight       *prometheus.GaugeVec
	serverInflightTokens *prometheus.GaugeVec
	serverDone           *prometheus.CounterVec
	shmBytes             prometheus.Gauge
	shmBudget            prometheus.Gauge
	diskFree             prometheus.Gauge
	diskReserve          prometheus.Gauge
}

func newMetrics() *metrics {
	m := &metrics{
		reg:                  prometheus.NewRegistry(),
		total:                prometheus.NewGauge(prometheus.GaugeOpts{Name: "extract_samples_total", Help: "Samples in the dataset."}),
		done:                 prometheus.NewGauge(prometheus.GaugeOpts{Name: "extract_samples_done", Help: "Samples whose output is durable and indexed."}),
		failed:               prometheus.NewGauge(prometheus.GaugeOpts{Name: "extract_samples_failed", Help: "Samples that failed every attempt in this job."}),
		inflight:             prometheus.NewGauge(prometheus.GaugeOpts{Name: "extract_samples_inflight", Help: "Samples sent to the server and not yet done."}),
		bytesWritten:         prometheus.NewGauge(prometheus.GaugeOpts{Name: "extract_output_bytes", Help: "Bytes of output files written by the job."}),
		rejected:             prometheus.NewCounterVec(prometheus.CounterOpts{Name: "extract_dumps_rejected_total", Help: "Dumps not accepted, by reason."}, []string{"reason"}),
		paused:               prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "extract_admission_paused", Help: "1 while admission is paused for this reason."}, []string{"reason"}),
		moveSeconds:          prometheus.NewHistogram(prometheus.HistogramOpts{Name: "extract_move_seconds", Help: "Time to validate, write, fsync and index one dump.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}),
		restarts:             prometheus.NewCounterVec(prometheus.CounterOpts{Name: "extract_server_restarts_total", Help: "Server restarts after a death or hang, by replica."}, []string{"replica"}),
		serverUp:             prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "extract_server_up", Help: "1 while the replica's server is ready."}, []string{"replica"}),
		serverInflight:       prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "extract_server_inflight_samples", Help: "Samples sent to the replica whose dump has not arrived."}, []string{"replica"}),
		serverInflightTokens: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "extract_server_inflight_tokens", Help: "Tokens of the samples sent to the replica whose dump has not arrived."}, []string{"replica"}),
		shmBytes:             prometheus.NewGauge(prometheus.GaugeOpts{Name: "extract_staging_bytes", Help: "Bytes in the staging dir."}),
		diskFree:             prometheus.NewGauge(prometheus.GaugeOpts{Name: "extract_output_free_bytes", Help: "Free bytes on the output disk."}),
		serverDone:           prometheus.NewCounterVec(prometheus.CounterOpts{Name: "extract_server_samples_done_total", Help: "Samples finished through the replica in this run."}, []string{"replica"}),
		shmBudget:            prometheus.NewGauge(prometheus.GaugeOpts{Name: "extract_staging_budget_bytes", Help: "Bytes the staging dir may hold (shm_budget)."}),
		diskReserve:          prometheus.NewGauge(prometheus.GaugeOpts{Name: "extract_output_reserve_bytes", Help: "Bytes kept free on the output disk (disk.reserve)."}),
	}
	m.reg.MustRegister(m.total, m.done, m.failed, m.inflight, m.bytesWritten, m.rejected, m.paused, m.moveSeconds, m.restarts, m.serverUp, m.serverInflight, m.serverInflightTokens, m.shmBytes, m.diskFree,
		m.serverDone, m.shmBudget, m.diskReserve,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// statusServer serves /status and /metrics for the live run.
type statusServer struct {
	mu      sync.Mutex
	current Status
	srv     *http.Server
	addr    string
	mux     *http.ServeMux // more read-only routes join it (serveReport)
}

func startStatusServer(listen string, m *metrics) (*statusServer, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("status.listen %s: %w", listen, err)
	}
	s := &statusServer{addr: ln.Addr().String()}
	mux := http.NewServeMux()
	mux.HandleFunc("/status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.get()) // a client gone mid-answer is no fault of ours
	})
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	s.mux = mux
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }() // it returns at close (ErrServerClosed)
	return s, nil
}

func (s *statusServer) set(st Status) {
	s.mu.Lock()
	s.current = st
	s.mu.Unlock()
}

func (s *statusServer) get() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.current
}

func (s *statusServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx) // past the deadline a scrape in flight is cut: nothing to keep
}

func progressPath(stateDir string) string { return filepath.Join(stateDir, "progress.json") }

// QueryStatus answers `extract status`: from the live process when a run holds the lock,
// else from the index. It never opens the index while a run holds it.
func QueryStatus(ctx context.Context, cfg *configs.Config) (Status, error) {
	st, err := queryStatus(ctx, cfg)
	if err == nil {
		st.Prepare = prepareStatus(cfg)
	}
	return st, err
}

func queryStatus(ctx context.Context, cfg *configs.Config) (Status, error) {
	h, held := LockHolder(cfg.StateDir)
	if held && !h.IsRun() {
		// verify, import or export: no run to ask, and its lock is no sign of one.
		st, err := statusFromIndex(cfg)
		if errors.Is(err, checkpoint.ErrLocked) {
			// It writes the index (verify --repair, import): the figures wait until it ends.
			st, err = Status{State: "stopped", Source: "lock", ETASeconds: -1, Dataset: cfg.Dataset, OutputDir: cfg.OutputDir}, nil
		}
		st.LockHolder = h.String()
		return st, err
	}
	if pid := h.PID; held {
		if st, err := queryLive(ctx, cfg.StateDir); err == nil {
			return st, nil
		}
		// The run is alive but not answering yet (still starting): its last snapshot.
		b, err := os.ReadFile(progressPath(cfg.StateDir))
		var st Status
		if err == nil && json.Unmarshal(b, &st) == nil {
			st.State, st.Source, st.PID = "running", "snapshot", pid
			return st, nil
		}
		return Status{State: "running", Source: "lock", PID: pid, ETASeconds: -1, Dataset: cfg.Dataset, OutputDir: cfg.OutputDir}, nil
	}
	return statusFromIndex(cfg)
}

func queryLive(ctx context.Context, stateDir string) (Status, error) {
	var st Status
	ri, err := readRunInfo(stateDir)
	if err != nil || ri.StatusAddr == "" {
		return st, errors.New("no live status address recorded")
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+ri.StatusAddr+"/status", nil)
	if err != nil {
		return st, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("status endpoint answered %s", resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return st, err
	}
	return st, json.Unmarshal(b, &st)
}

func statusFromIndex(cfg *configs.Config) (Status, error) {
	st := Status{State: "stopped", Source: "index", ETASeconds: -1, Dataset: cfg.Dataset, OutputDir: cfg.OutputDir, Paused: []string{}, Rejected: map[string]int64{}}
	ix, missing, err := openIndexToQuery(cfg)
	if missing && hasGenerateIndex(cfg.StateDir) {
		return st, nil // only the generate stage has run: its block says where it stands
	}
	if err != nil {
		return st, err
	}
	defer func() { _ = ix.Close() }()
	meta, ok, err := ix.Meta()
	if err != nil {
		return st, err
	}
	c, err := ix.Counters()
	if err != nil {
		return st, err
	}
	if ok {
		lo, hi := ShardRange(meta.Total, meta.ShardIndex, meta.ShardCount)
		st.Total, st.DatasetSamples = hi-lo, meta.Total
		st.Dataset = meta.DatasetPath
	}
	st.Done, st.Failed, st.BytesWritten, st.Imported = c.Done, c.Failed, c.BytesWritten, c.Imported
	st.Pending = st.Total - st.Done - st.Failed
	if st.Total > 0 && st.Done == st.Total {
		st.State, st.ETASeconds = "complete", 0
	}
	if info, err := os.Stat(ix.Path()); err == nil {
		st.UpdatedAt = info.ModTime()
	}
	st.Rejected = lastRejected(cfg.StateDir)
	return st, nil
}

// openIndexToQuery opens the job's index read-only for status and status --sample;
// missing says there is none yet, and the error is then noIndex's.
func openIndexToQuery(cfg *configs.Config) (ix *checkpoint.Index, missing bool, err error) {
	path := filepath.Join(cfg.StateDir, "index.db")
	if _, err := os.Stat(path); err != nil {
		if os.IsNotExist(err) {
			return nil, true, noIndex(cfg, path)
		}
		return nil, false, fmt.Errorf("index %s: %w", path, err)
	}
	ix, err = checkpoint.Open(path, checkpoint.OpenOptions{ReadOnly: true, Timeout: time.Second})
	return ix, false, err
}

// noIndex is status with no index at path: no job has run with this config here, or
// its state is per shard. A "stopped 0 of N" would read as a job that lost its work
// (exit 2, as verify answers the same case).
func noIndex(cfg *configs.Config, path string) error {
	hint := "has a job run with this config? `extract run` creates it"
	if plans, err := planDirs(cfg.JobStateDir()); err == nil && len(plans) > 0 && !cfg.Shard.Sharded() {
		hint = fmt.Sprintf("%s holds a sharded job's state (shard-<i>-of-<n> dirs): `extract status --all` shows the whole job, `--shard i/n` one shard", cfg.JobStateDir())
	}
	return fmt.Errorf("%w: no index at %s: %s", ErrRefused, path, hint)
}

// lastRejected is what the last run's progress snapshot counted as rejected dumps, by
// reason: the index does not record them, and a status after the run should not say
// none were.
func lastRejected(stateDir string) map[string]int64 {
	var snap struct {
		Rejected map[string]int64 `json:"rejected"`
	}
	b, err := os.ReadFile(progressPath(stateDir))
	if err != nil || json.Unmarshal(b, &snap) != nil || snap.Rejected == nil {
		return map[string]int64{}
	}
	return snap.Rejected
}

// countLines counts a JSONL file's samples without decoding them: newline-terminated
// lines, plus a last line without one.
func countLines(path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }()
	buf := make([]byte, 1<<20)
	n, last := 0, byte('\n')
	for {
		k, err := f.Read(buf)
		if k > 0 {
			n += bytes.Count(buf[:k], []byte{'\n'})
			last = buf[k-1]
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, err
		}
	}
	if last != '\n' {
		n++
	}
	return n, nil
}
