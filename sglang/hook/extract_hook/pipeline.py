"""From a batch's rows on the GPU to dump files, without the forward thread waiting.

The shared data path of a server that dumps (the transformers server uses it; see
docs/server.md): the forward thread gathers the rows it wants into one device buffer
and calls Pipeline.submit, which only enqueues. A side stream copies the buffer into
one of a few pinned host buffers, reused batch after batch (pinning is slow, and
pageable copies run at 1.5 GB/s against 55 on an H200); one waiter thread waits on each
batch's CUDA event in order and hands its requests to the writer threads; a pinned
buffer goes back to the pool once every dump of its batch is written. So the next
forward runs while this batch is copied and written, and the pool bounds how far the
GPU gets ahead of the disk.

Rows on the host are laid out as written: every request's aux rows, then every
request's final rows, so one request's [T, 3H] and [T, H] are each one contiguous
slice and go to the file without another copy. Imports torch only when a Pipeline is
made.
"""

import collections
import logging
import queue
import threading

log = logging.getLogger("extract_hook")

# A batch on its way to the files: host is its bf16 block of rows x 4H (aux block, then
# final block) inside buffer (pooled is whether buffer goes back to the pool); spans
# holds each item's (start, end) rows; write(host, item, start, end, rows) writes one
# item, in a writer thread; finished() runs once all have.
Batch = collections.namedtuple("Batch", "event host buffer pooled items spans rows write finished")


def layout(rows, hidden, start, end):
    """Element offsets (aux0, aux1, final0, final1) of rows [start, end) in a host
    block of `rows` rows laid out aux block [rows, 3H] then final block [rows, H]."""
    if not 0 <= start <= end <= rows:
        raise ValueError(f"rows [{start}, {end}) outside a batch of {rows}")
    aux0, aux1 = start * 3 * hidden, end * 3 * hidden
    base = rows * 3 * hidden
    return aux0, aux1, base + start * hidden, base + end * hidden


class Pipeline:
    """buffers pinned host buffers of capacity_rows x 4H bf16 each, one side stream,
    one waiter thread, `writers` writer threads."""

    def __init__(self, torch, device, capacity_rows, hidden, buffers=3, writers=8):
        import concurrent.futures

        self._torch = torch
        self.hidden = hidden
        self.capacity_rows = capacity_rows
        pinned = device.type == "cuda"
        self._free = queue.Queue()
        for _ in range(buffers):
            self._free.put(torch.empty(capacity_rows * 4 * hidden, dtype=torch.bfloat16, pin_memory=pinned))
        self._side = torch.cuda.Stream(device=device) if pinned else None
        self._waiting = queue.Queue()
        self._writers = concurrent.futures.ThreadPoolExecutor(writers, thread_name_prefix="dump")
        self.failed = None  # the waiter's exception: the server cannot go on
        threading.Thread(target=self._wait_loop, name="copy-waiter", daemon=True).start()

    def device_buffer(self, rows):
        """A [rows x 4H] bf16 device buffer for the forward thread to gather into, and
        its aux [rows, 3H] and final [rows, H] views."""
        return self._views(self._torch.empty(rows * 4 * self.hidden, dtype=self._torch.bfloat16, device=self._device_of()), rows)

    def _device_of(self):
        return self._side.device if self._side is not None else "cpu"

    def _views(self, flat, rows):
        h = self.hidden
        return flat, flat[: rows * 3 * h].view(rows, 3 * h), flat[rows * 3 * h :].view(rows, h)

    def submit(self, flat, rows, items, spans, write, finished):
        """Queues the copy of flat (from device_buffer, filled by kernels on the current
        stream) and returns; blocks first while every pinned buffer is in use."""
        if self.failed is not None:
            raise RuntimeError(f"dump pipeline failed: {self.failed}")
        need = rows * 4 * self.hidden
        pooled = rows <= self.capacity_rows
        if pooled:
            buf = self._free.get()
        else:  # a prompt longer than the batch budget runs alone: a buffer of its own
            buf = self._torch.empty(need, dtype=self._torch.bfloat16, pin_memory=self._side is not None)
        host = buf[:need]
        event = None
        if self._side is not None:
            torch = self._torch
            self._side.wait_stream(torch.cuda.current_stream(flat.device))
            with torch.cuda.stream(self._side):
                host.copy_(flat, non_blocking=True)
                # The forward stream frees flat when the caller drops it; the allocator
                # must not reuse it before the copy on this stream is done.
                flat.record_stream(self._side)
                event = torch.cuda.Event()
                event.record(self._side)
        else:
            host.copy_(flat)
        self._waiting.put(Batch(event, host, buf, pooled, items, spans, rows, write, finished))

    def _wait_loop(self):
        # One thread waits on the events in submission order (they complete in that
        # order on one stream); a thread per batch cost more than it overlapped.
        try:
            while True:
                b = self._waiting.get()
                if b.event is not None:
                    b.event.synchronize()
                self._dispatch(b)
        except BaseException as e:  # a CUDA error: nothing more can be copied
            log.exception("copy waiter died")
            self.failed = f"{type(e).__name__}: {e}"

    def _dispatch(self, b):
        left = [len(b.items)]
        lock = threading.Lock()

        def one(item, span):
            try:
                b.write(b.host, item, span[0], span[1], b.rows)
            except BaseException:  # write answers its own errors: this is a bug
                log.exception("dump writer failed")
            finally:
                with lock:
                    left[0] -= 1
                    last = left[0] == 0
                if last:
                    self._done(b)

        if not b.items:
            self._done(b)
            return
        for item, span in zip(b.items, b.spans):
            self._writers.submit(one, item, span)

    def _done(self, b):
        if b.pooled:
            self._free.put(b.buffer)
        b.finished()
