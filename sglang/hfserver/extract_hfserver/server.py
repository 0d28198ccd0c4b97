"""Batching worker and dump writing of the transformers server (its HTTP front is front.py).

Threads: http.server answers each connection on its own thread and queues /generate
requests; one worker thread takes windows of them, sorted by length, cuts them into
batches under the token budget, runs each forward, gathers the real rows of the
captured layers on the GPU and hands them to extract_hook.pipeline, which copies them
to pinned host memory on a side stream and writes the dumps on its writer threads
while the next forward runs. A /generate answers only after its dump is renamed into
place, so (unlike SGLang's hook, which writes after the answer) a 200 means the file is
there. A /health_generate probe's forward runs before the worker's next batch, not
behind the queue.
"""

import argparse
import array
import logging
import os
import queue
import sys
import threading
import time

from extract_hook import writer

from . import SERVER_VERSION, backend
from .batching import Request, Serving, plan_window, spans
from .front import Handler, Listener

log = logging.getLogger("extract_hfserver")

# The prefix the orchestrator looks for in a dead server's log (sglang.HookRefusal):
# a refusal at start is a preflight failure (exit 3), not a crash worth a restart.
FATAL = "extract-hook: FATAL: "
EXIT_REFUSED = 3


def check_layers(layers, num_layers):
    """Layer id k is captured at the input of decoder layer k, as in SGLang (see
    README.md), which is hidden_states[k]; k = num_layers has no decoder layer (HF's last
    entry is post-norm), so ids run 1..num_layers-1."""
    bad = [k for k in layers if not 1 <= k <= num_layers - 1]
    if bad:
        raise ValueError(
            f"layers {','.join(map(str, layers))}: ids {bad} outside 1..{num_layers - 1} "
            f"for a model of {num_layers} layers"
        )


# Put in the queue beside each probe, so that an idle worker wakes for it.
_WAKE = object()


class Engine:
    """Owns the backend, the queue, the batch worker and the dump pipeline."""

    def __init__(self, args):
        self.args = args
        self.layers = writer.parse_layers(args.layers)
        self.model = None
        self.pipeline = None  # made on the first batch, on the device of its output
        self.ready = threading.Event()
        self.dead = None  # set to a message when the worker died
        self.queue = queue.Queue()
        self.probes = queue.Queue()  # /health_generate's forwards, run before the next batch
        self._probing = []  # the probes of the forward running now, for the death path
        self.stats = {"batches": 0, "requests": 0, "tokens": 0, "padded_tokens": 0, "max_batch_requests_seen": 0, "forward_seconds": 0.0,
                      "buffer_wait_seconds": 0.0}
        self.stats_lock = threading.Lock()
        self.serving = Serving()
        self._streams = None  # the forward streams, made on the first batch (_stream)
        self._turn = 0

    def load(self):
        opts = backend.Options(dtype=self.args.dtype, tp_size=self.args.tp_size, attn_implementation=self.args.attn_implementation)
        model = backend.load(self.args.model_path, opts)
        check_layers(self.layers, model.num_layers)
        self.model = model

    def start(self):
        threading.Thread(target=self._worker, name="batcher", daemon=True).start()

    def submit(self, req):
        if self.dead:
            req.finish(500, self.dead)
        else:
            self.queue.put(req)
        return req

    def probe(self, req):
        """Queues a health probe's forward ahead of the requests: it runs before the
        worker's next batch. Behind the queue it would wait out a whole sort window (as
        many requests as the orchestrator holds open: 384 by default), longer than the
        orchestrator's probe timeouts on a slow model; it still needs the GPU to answer."""
        if self.dead:
            req.finish(500, self.dead)
        else:
            self.probes.put(req)
            self.queue.put(_WAKE)
        return req

    def _worker(self):
        window = []
        try:
            while True:
                window = [self.queue.get()]
                # Gather what arrived meanwhile, and give a burst a moment to arrive.
                deadline = time.monotonic() + self.args.batch_wait
                while len(window) < self.args.window_requests:
                    try:
                        timeout = max(0.0, deadline - time.monotonic())
                        window.append(self.queue.get(timeout=timeout) if timeout else self.queue.get_nowait())
                    except queue.Empty:
                        break
                window = [r for r in window if r is not _WAKE]
                batches = plan_window(window, self.args.max_batch_tokens, self.args.max_batch_requests)
                window = [r for b in batches for r in b]
                self._run_probes()
                while batches:
                    self._run(batches[0])
                    window = window[len(batches.pop(0)) :]
                    self._run_probes()
        except BaseException as e:  # the server cannot serve any more: say so everywhere
            log.exception("batch worker died")
            self.dead = f"batch worker died: {type(e).__name__}: {e}"
            for req in [*window, *self._probing]:
                req.finish(500, self.dead)
            for q in (self.queue, self.probes):
                while True:
                    try:
                        req = q.get_nowait()
                    except queue.Empty:
                        break
                    if req is not _WAKE:
                        req.finish(500, self.dead)
            # Exit rather than linger unable to serve: the orchestrator sees a dead server
            # at once and restarts it (within server.max_restarts).
            time.sleep(0.5)  # let the handlers answer the failed requests
            os._exit(1)

    def _run_probes(self):
        """Runs the probes waiting, as one batch of one-token forwards."""
        probes = []
        while len(probes) < self.args.max_batch_requests:
            try:
                probes.append(self.probes.get_nowait())
            except queue.Empty:
                break
        if probes:
            self._probing = probes
            self._run(probes)
            self._probing = []

    def _run(self, batch):
        """Runs one batch's forward and queues its dumps; returns without waiting for
        the GPU, the copy to the host or the writes (pipeline.py)."""
        import torch

        model = self.model
        lengths = [len(r.ids) for r in batch]
        width = max(lengths)
        # A handful of tensor ops a batch rather than a few a request: every torch call
        # gives the GIL up and takes it back, and with the HTTP and writer threads
        # wanting it each take-back can wait (docs/performance.md).
        padded = []
        for r in batch:
            # Right padding: position ids stay 0..T-1 for every request, and causal
            # attention never lets a real token see the pads after it.
            padded += r.ids
            padded += [0] * (width - len(r.ids))
        ids = torch.tensor(padded, dtype=torch.int64).view(len(batch), width)
        mask = (torch.arange(width).unsqueeze(0) < torch.tensor(lengths).unsqueeze(1)).to(torch.int64)
        # The real rows' positions in the flattened [B * W] batch: only these are copied.
        rows = mask.view(-1).nonzero().view(-1)
        started = time.monotonic()
        try:
            with self._stream(torch, model.device):
                waited = self._forward(torch, model, batch, ids, mask, rows, lengths)
        except _out_of_memory() as e:
            # Too big a batch for this GPU: fail these requests (the orchestrator retries
            # them) and keep serving; a smaller server.transformers.max_batch_tokens fixes it.
            log.error("out of memory on a batch of %d requests x %d tokens: %s", len(batch), width, e)
            for r in batch:
                r.finish(503, f"out of memory on a batch of {len(batch)} x {width} tokens; lower server.transformers.max_batch_tokens")
            return
        elapsed = time.monotonic() - started
        with self.stats_lock:
            s = self.stats
            s["batches"] += 1
            s["requests"] += len(batch)
            s["tokens"] += sum(lengths)
            s["padded_tokens"] += width * len(batch)
            s["max_batch_requests_seen"] = max(s["max_batch_requests_seen"], len(batch))
            s["forward_seconds"] += elapsed - waited  # the forward thread's time: the GPU runs on after it
            s["buffer_wait_seconds"] += waited
            n = s["batches"]
        # One line a batch: with it an offline forward can replay the very same batch
        # (same padding, same shapes, same kernels) and compare bit for bit
        # (scripts/device_transformers.py); "-" is a health probe's [0]. Then the forward
        # thread's milliseconds on it and those it waited for a free host buffer.
        log.info("batch %d: width %d rids %s ms %.1f wait %.1f", n, width, ",".join(r.rid or "-" for r in batch),
                 1e3 * (elapsed - waited), 1e3 * waited)

    def _stream(self, torch, device):
        """The CUDA stream this batch runs on, in turn among --forward-streams. The
        attention mask's padding check (transformers' padding_mask.all()) waits for the
        current stream to drain: on one stream every batch's launches start only once
        the batch before it is done, so the GPU idles while this thread, sharing the GIL
        with the HTTP and writer threads, launches the first kernels. On two, the check
        waits for the batch before last, and one batch is always queued."""
        import contextlib

        if device.type != "cuda" or self.args.forward_streams < 2:
            return contextlib.nullcontext()
        if self._streams is None:
            self._streams = [torch.cuda.Stream(device=device) for _ in range(self.args.forward_streams)]
            for st in self._streams:  # the weights were loaded on the default stream
                st.wait_stream(torch.cuda.current_stream(device))
        self._turn += 1
        return torch.cuda.stream(self._streams[self._turn % len(self._streams)])

    def _forward(self, torch, model, batch, ids, mask, rows, lengths):
        """The forward, the gather of the real rows and the hand-off to the pipeline, on
        the current stream. Returns the seconds submit waited for a free host buffer."""
        ids, mask, rows = (to_device(t, model.device) for t in (ids, mask, rows))
        captured, final = capture(model, ids, mask, self.layers)
        dev = final.device
        if self.pipeline is None:
            from extract_hook import pipeline

            self.pipeline = pipeline.Pipeline(torch, dev, max(self.args.max_batch_tokens, 1), model.hidden_size,
                                              buffers=self.args.host_buffers, writers=self.args.writers)
        h = model.hidden_size
        n = int(rows.numel())
        flat, aux, fin = self.pipeline.device_buffer(n)
        rows = rows.to(dev, non_blocking=True)
        for j, c in enumerate(captured):
            aux[:, j * h : (j + 1) * h] = c.to(dev).reshape(-1, h).index_select(0, rows)
        if final.dtype == fin.dtype:
            torch.index_select(final.reshape(-1, h), 0, rows, out=fin)
        else:  # a float32 (or float16) model: dumps are bfloat16, out= does not convert
            fin.copy_(final.reshape(-1, h).index_select(0, rows))
        del captured, final, aux, fin
        t = time.monotonic()
        self.pipeline.submit(flat, n, batch, spans(lengths), self._write, lambda: None)
        return time.monotonic() - t

    def _write(self, host, r, start, end, rows):
        """Writes request r's dump from rows [start, end) of its batch's host block (a
        writer thread of the pipeline); answers r."""
        if r.rid is None:  # a health probe: the forward ran, nothing to dump
            r.finish()
            return
        from extract_hook import pipeline

        try:
            a0, a1, f0, f1 = pipeline.layout(rows, self.model.hidden_size, start, end)
            raw = host_bytes(host)
            writer.write_dump(
                self.args.shm_dir,
                r.rid,
                aux=raw[2 * a0 : 2 * a1],
                hidden=raw[2 * f0 : 2 * f1],
                input_ids=array.array("q", r.ids),
                tokens=end - start,
                hidden_size=self.model.hidden_size,
                layers=self.layers,
                model=self.args.model_path,
            )
        except writer.DumpInProgress as e:  # not ours: another process, or left over
            log.error("rid %s: dump not written: %s", r.rid, e)
            r.finish(409, f"dump of rid {r.rid} not written: {e}")
            return
        except Exception as e:  # tmpfs full, dir gone: this request fails, the server goes on
            log.error("rid %s: dump failed: %s", r.rid, e)
            r.finish(500, f"dump of rid {r.rid} failed: {e}")
            return
        r.finish()

    def info(self):
        with self.stats_lock:
            stats = dict(self.stats)
        m = self.model
        return {
            # The keys CheckCapture reads, with the values that mean "capture is whole":
            # every prompt is one unchunked, uncached forward here by construction.
            "model_path": self.args.model_path,
            "tp_size": self.args.tp_size,
            "disable_radix_cache": True,
            "chunked_prefill_size": -1,
            "enable_two_batch_overlap": False,
            "version": f"extract-hfserver {SERVER_VERSION}",
            "server_kind": "transformers",
            "backend": m.name if m else None,
            "layers": writer.format_layers(self.layers),
            "dtype": self.args.dtype,
            "max_batch_tokens": self.args.max_batch_tokens,
            "max_batch_requests": self.args.max_batch_requests,
            "window_requests": self.args.window_requests,
            "ready": self.ready.is_set(),
            "stats": stats,
            "serving": self.serving.count(),
        }


def capture(model, input_ids, attention_mask, layers):
    """(the inputs of decoder layers `layers`, the final post-norm output), each
    [B, S, H]. A backend with capture() (the transformers one: forward pre-hooks on
    those layers only) keeps no other layer's output alive; any other backend's
    forward returns all of them and these are picked."""
    if hasattr(model, "capture"):
        return model.capture(input_ids, attention_mask, layers)
    hidden_states, final = model.forward(input_ids, attention_mask)
    if len(hidden_states) != model.num_layers + 1:
        raise RuntimeError(f"model returned {len(hidden_states)} hidden states, want {model.num_layers + 1}")
    return [hidden_states[k] for k in layers], final


def to_device(tensor, device):
    """A small CPU tensor on device without waiting for the GPU: a copy from pageable
    memory first synchronises the stream, which would hold this thread until the last
    batch's forward is done; from pinned memory it is queued like a kernel."""
    if device.type != "cuda":
        return tensor
    return tensor.pin_memory().to(device, non_blocking=True)


def host_bytes(tensor):
    """The bytes of a CPU bf16 tensor, without a copy (numpy has no bf16: viewed as int16)."""
    import torch

    return memoryview(tensor.view(torch.int16).numpy()).cast("B")


def _out_of_memory():
    import torch

    return getattr(torch.cuda, "OutOfMemoryError", MemoryError)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="extract_hfserver")
    p.add_argument("--model-path", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--shm-dir", required=True)
    p.add_argument("--layers", required=True, help="effective layers_to_capture, e.g. 2,30,58")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--attn-implementation", default="")
    p.add_argument("--max-batch-tokens", type=int, default=16384, help="padded tokens per forward")
    p.add_argument("--max-batch-requests", type=int, default=64)
    p.add_argument("--batch-wait", type=float, default=0.005, help="seconds a batch waits for more requests")
    p.add_argument("--window-requests", type=int, default=256,
                   help="requests sorted by length together before they are cut into batches")
    # Measured on an H200 with the output on a tmpfs (docs/performance.md): 2 writers
    # 112,972 tok/s, 4: 116,571, 8: 110,079, 16 (6 host buffers): 95,226. Past 4 the
    # writers take the GIL from the batch thread more than they add bandwidth.
    p.add_argument("--writers", type=int, default=4, help="threads writing dumps")
    p.add_argument("--forward-streams", type=int, default=2,
                   help="CUDA streams the batches take in turn, so one is queued while the GPU runs another")
    p.add_argument("--host-buffers", type=int, default=3,
                   help="pinned host buffers of max-batch-tokens rows: batches copied or written at once")
    return p.parse_args(argv)


def main(argv=None):
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(sys.argv[1:] if argv is None else argv)
    engine = Engine(args)  # parses --layers
    if not os.path.isdir(args.shm_dir):
        print(f"{FATAL}staging dir {args.shm_dir} is not a directory", flush=True)
        return EXIT_REFUSED
    # Listen before loading, as SGLang does not: a probe gets 503 "loading" rather than a
    # refused connection, and the orchestrator tells a slow load from a dead server.
    Handler.engine = engine
    httpd = Listener((args.host, args.port), Handler)
    threading.Thread(target=httpd.serve_forever, name="http", daemon=True).start()
    log.info("listening on %s:%d; loading %s", args.host, args.port, args.model_path)
    started = time.monotonic()
    try:
        engine.load()
    except ValueError as e:  # the layers do not fit the model: a restart would refuse again
        print(f"{FATAL}{e}", flush=True)
        return EXIT_REFUSED
    m = engine.model
    log.info("loaded %s (%s, %d layers, hidden %d) in %.1fs on %s", args.model_path, m.name, m.num_layers, m.hidden_size, time.monotonic() - started, m.device)
    engine.start()
    # One forward before the marker: the first CUDA call (kernels, allocator) happens
    # now, not inside the first real request's timeout.
    warm = engine.submit(Request(None, [0] * 8))
    warm.done.wait()
    if warm.status != 200:
        print(f"extract-hfserver: warm-up forward failed: {warm.error}", flush=True)
        return 1
    writer.remove_stale_markers(args.shm_dir)
    writer.write_marker(args.shm_dir, os.getpid(), {
        "layers": writer.format_layers(engine.layers), "model": args.model_path,
        "tp_size": args.tp_size, "server": "transformers", "server_version": SERVER_VERSION,
        "backend": m.name,
    })
    engine.ready.set()
    log.info("The server is fired up and ready to roll!")
    while True:
        time.sleep(3600)
