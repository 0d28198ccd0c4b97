"""The requests being served and how they are cut into batches: pure Python (no torch)."""

import collections
import threading


class Request:
    __slots__ = ("rid", "ids", "done", "error", "status", "on_finish")

    def __init__(self, rid, ids):
        self.rid, self.ids = rid, ids
        self.done = threading.Event()
        self.error, self.status = None, 200
        self.on_finish = None

    def finish(self, status=200, error=None):
        self.status, self.error = status, error
        if self.on_finish is not None:
            self.on_finish(self)
        self.done.set()


class Serving:
    """The requests being served, one per rid.

    The Go client retries a 5xx or a broken connection under the same rid, so a second
    POST of a rid can arrive while the first is still queued, in a forward or being
    written. It joins the first (same input ids: it gets the first's answer, and the
    rid is computed and written once) or is refused with 409 (other ids: not the same
    request). Two requests of one rid never write one dump at the same time.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._by_rid = {}

    def admit(self, rid, ids):
        """Returns (request, is_new), or (None, conflict message)."""
        with self._lock:
            current = self._by_rid.get(rid)
            if current is not None:
                if current.ids != ids:
                    return None, f"rid {rid} is being served with other input ids"
                return current, False
            req = Request(rid, ids)
            req.on_finish = self._release
            self._by_rid[rid] = req
            return req, True

    def count(self):
        with self._lock:
            return len(self._by_rid)

    def _release(self, req):
        with self._lock:
            if self._by_rid.get(req.rid) is req:
                del self._by_rid[req.rid]


def plan_batch(pending, first, max_tokens, max_requests):
    """Takes requests from the deque pending after first while the padded batch (longest
    prompt x count) stays within max_tokens and max_requests. A prompt longer than the
    budget runs alone. Returns the batch."""
    batch = [first]
    longest = len(first.ids)
    while pending and len(batch) < max_requests:
        nxt = pending[0]
        width = max(longest, len(nxt.ids))
        if width * (len(batch) + 1) > max_tokens:
            break
        pending.popleft()
        batch.append(nxt)
        longest = width
    return batch


def plan_window(window, max_tokens, max_requests):
    """Cuts a window of requests into batches: sorted by prompt length first, so each
    batch holds prompts of about one length and little of its forward is padding (in
    arrival order half of it was). Every request of the window runs before any request
    that arrived after it, so none waits behind later ones for long. Returns the list
    of batches in the order they run."""
    pending = collections.deque(sorted(window, key=lambda r: len(r.ids)))
    batches = []
    while pending:
        batches.append(plan_batch(pending, pending.popleft(), max_tokens, max_requests))
    return batches


def spans(lengths):
    """(start, end) rows of each prompt in the gathered [sum(lengths), ...] block."""
    out, at = [], 0
    for n in lengths:
        out.append((at, at + n))
        at += n
    return out
