"""From one EXTEND forward's tensors to one dump per request.

plan_requests is pure Python: it maps each request of the batch to its rows. write_batch
copies the batch's rows to the host once and hands each request's slice to the writer
on background threads; it imports torch when called, so this module imports anywhere.
"""

import collections
import concurrent.futures
import functools
import logging

from . import writer

log = logging.getLogger("extract_hook")


# One request to dump: its rid and its rows [start, end) of the batch.
Job = collections.namedtuple("Job", "rid start end")


def plan_requests(reqs, extend_lens, prefix_lens, rows):
    """Maps the requests of an EXTEND batch to their rows.

    reqs holds (rid, prompt length) per request, in batch order; extend_lens and
    prefix_lens are the batch's per-request extend and cached-prefix lengths; rows is the
    number of rows the model produced. Returns (jobs, skipped): skipped holds (rid,
    reason, is_error) for requests that get no dump. Raises ValueError when the lengths
    do not describe the rows at all.
    """
    if not (len(reqs) == len(extend_lens) == len(prefix_lens)):
        raise ValueError(
            f"batch has {len(reqs)} requests, {len(extend_lens)} extend lengths "
            f"and {len(prefix_lens)} prefix lengths"
        )
    if sum(extend_lens) != rows:
        raise ValueError(f"extend lengths add up to {sum(extend_lens)}, the model produced {rows} rows")
    jobs, skipped = [], []
    start = 0
    for (rid, prompt_len), extend_len, prefix_len in zip(reqs, extend_lens, prefix_lens):
        end = start + extend_len
        if not (isinstance(rid, str) and writer.RID_PATTERN.match(rid)):
            # SGLang's own warm-up and health-check requests: not ours to dump.
            skipped.append((rid, "not a protocol v1 rid", False))
        elif prefix_len != 0:
            skipped.append((rid, f"{prefix_len} prompt tokens came from a cache, their rows are missing", True))
        elif extend_len != prompt_len:
            skipped.append((rid, f"extend of {extend_len} tokens is not the whole prompt of {prompt_len}", True))
        else:
            jobs.append(Job(rid, start, end))
        start = end
    return jobs, skipped


def write_batch(directory, layers, model, reqs, forward_batch, input_ids, hidden_states, aux_hidden_states):
    """Dumps the requests of one EXTEND forward (called on TP rank 0 only).

    hidden_states is the final, post-norm [rows, H]; aux_hidden_states is SGLang's
    capture: a list of three [rows, H] tensors or one packed [rows, 3H] tensor. The rows
    are queued for copying to pinned host memory on a side stream (see _copy_out); the
    files are written by background threads, so neither the GPU nor the forward thread
    waits for them.
    """
    jobs, skipped = plan_requests(
        reqs,
        [int(n) for n in forward_batch.extend_seq_lens_cpu],
        [int(n) for n in forward_batch.extend_prefix_lens_cpu],
        int(hidden_states.shape[0]),
    )
    for rid, reason, is_error in skipped:
        (log.error if is_error else log.info)("rid %s not dumped: %s", rid, reason)
    if not jobs:
        return

    if input_ids is None:
        raise RuntimeError("extract-hook: FATAL: extend batch without input_ids on its ForwardBatch")

    import torch

    hidden_size = int(hidden_states.shape[1])
    rows = int(hidden_states.shape[0])
    parts = [aux_hidden_states] if isinstance(aux_hidden_states, torch.Tensor) else list(aux_hidden_states)
    if sum(int(p.shape[-1]) for p in parts) != writer.AUX_LAYERS * hidden_size or any(
        int(p.shape[0]) != rows for p in parts
    ):
        raise ValueError(
            f"aux hidden states {[tuple(p.shape) for p in parts]} do not hold "
            f"{writer.AUX_LAYERS} layers of {rows} x {hidden_size}"
        )

    _background.wait_for_room()
    ready = _copy_out(torch, input_ids, hidden_states, parts)
    ids_host, hidden_host, parts_host = ready.ids, ready.hidden, ready.parts

    def write(job):
        s, e = job.start, job.end
        # The copies run on the side stream; wait here, in a writer thread, for them
        # to land, never in the forward thread.
        ready.wait()
        aux_rows = parts_host[0][s:e] if len(parts_host) == 1 else torch.cat([p[s:e] for p in parts_host], dim=1)
        try:
            writer.write_dump(
                directory,
                job.rid,
                aux=_raw(torch, aux_rows),
                hidden=_raw(torch, hidden_host[s:e]),
                input_ids=_raw(torch, ids_host[s:e]),
                tokens=e - s,
                hidden_size=hidden_size,
                layers=layers,
                model=model,
            )
        except OSError as err:
            # A full or vanished staging dir must not take the server down: the
            # orchestrator sees no dump for this rid and retries it as a new attempt.
            log.error("rid %s: dump not written: %s", job.rid, err)

    _background.submit([(job.rid, functools.partial(write, job)) for job in jobs])


def flush():
    """Waits until every dump handed to the writer threads is on disk."""
    _background.drain(0)


class _Background:
    """Writer threads with at most _MAX_BATCHES batches in host memory: a forward waits
    for room before it copies its rows, which bounds the pinned memory that dumps hold.
    An exception other than OSError in a writer thread is a bug; it is raised again here,
    in the scheduler's thread, so that it takes the server down rather than losing dumps."""

    def __init__(self):
        self._pool = None
        self._batches = collections.deque()
        # rid -> its latest pending write. A rid prefilled twice in quick succession (a
        # repeated POST) must not have two threads writing one .partial file.
        self._latest = {}

    def wait_for_room(self):
        self.drain(_MAX_BATCHES - 1)

    def submit(self, jobs):
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(_WRITERS, thread_name_prefix="extract-hook-writer")
        batch = []
        for rid, fn in jobs:
            earlier = self._latest.get(rid)
            if earlier is not None:
                # The pool runs jobs in submission order, so the earlier write has
                # started by the time this one waits for it.
                fn = functools.partial(_after, earlier, fn)
            future = self._pool.submit(fn)
            self._latest[rid] = future
            batch.append((rid, future))
        self._batches.append(batch)

    def drain(self, keep):
        while self._batches and (len(self._batches) > keep or all(f.done() for _, f in self._batches[0])):
            for rid, future in self._batches.popleft():
                if self._latest.get(rid) is future:
                    del self._latest[rid]
                future.result()


def _after(earlier, fn):
    concurrent.futures.wait([earlier])
    fn()


# Files go to a tmpfs, so writing is a memory copy that several threads do faster than
# one (measured on an H200 host: 1.5-1.7 GB/s with one, 3.9-4.7 GB/s with four). Two
# batches let one be written while the next is copied out.
_WRITERS = 4
_MAX_BATCHES = 2
_background = _Background()


class _HostCopy:
    """A batch's rows in host memory, with the event that says they have landed."""

    def __init__(self, ids, hidden, parts, event):
        self.ids, self.hidden, self.parts, self._event = ids, hidden, parts, event

    def wait(self):
        if self._event is not None:
            self._event.synchronize()


_side_streams = {}


def _copy_out(torch, input_ids, hidden_states, parts):
    """Queues the device-to-host copies of one batch and returns at once.

    On CUDA the copies go on a side stream that first waits (on the GPU, not the CPU)
    for the forward stream's kernels that made the rows, into pinned host buffers (on
    an H200 we measured 55 GB/s that way against 1.7 GB/s into pageable memory); an
    event recorded after them is what the writer threads wait on. The forward thread
    only enqueues: it no longer waits for the whole forward stream and the copy, which
    took the overlap scheduler's CPU/GPU overlap away (docs/server.md has the figures).
    Copying the aux parts one by one keeps the GPU free of a [rows, 3H] temporary.
    """
    if not hidden_states.is_cuda:
        return _HostCopy(
            _to_host(torch, input_ids, torch.int64),
            _to_host(torch, hidden_states, torch.bfloat16),
            [_to_host(torch, p, torch.bfloat16) for p in parts],
            None,
        )
    device = hidden_states.device
    forward_stream = torch.cuda.current_stream(device)
    side = _side_streams.get(device)
    if side is None:
        side = _side_streams[device] = torch.cuda.Stream(device=device)
    sources = [input_ids, hidden_states, *parts]
    with torch.cuda.stream(side):
        side.wait_stream(forward_stream)
        for t in sources:
            # The forward stream may free these as soon as the model drops them; the
            # allocator must not hand their memory out before the side stream is done.
            if t.is_cuda:
                t.record_stream(side)
        ids = _to_host(torch, input_ids, torch.int64)
        hidden = _to_host(torch, hidden_states, torch.bfloat16)
        host_parts = [_to_host(torch, p, torch.bfloat16) for p in parts]
        event = torch.cuda.Event()
        event.record(side)
    return _HostCopy(ids, hidden, host_parts, event)


def _to_host(torch, tensor, dtype):
    src = tensor.to(dtype).contiguous()
    dst = torch.empty(src.shape, dtype=dtype, pin_memory=src.is_cuda)
    dst.copy_(src, non_blocking=src.is_cuda)
    return dst


def _raw(torch, tensor):
    """The little-endian bytes of a CPU tensor, without a copy."""
    return memoryview(tensor.contiguous().view(torch.uint8).numpy())
