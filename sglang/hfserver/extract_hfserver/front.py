"""The transformers server's HTTP front: one thread a connection, each answering from the
engine (server.py). /generate waits for its request's dump; /health_generate for a
probe's forward, which runs before the worker's next batch."""

import json
import logging
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from extract_hook import writer

from . import SERVER_VERSION, generation
from .batching import Request

log = logging.getLogger("extract_hfserver")


class Handler(BaseHTTPRequestHandler):
    server_version = "extract-hfserver/" + SERVER_VERSION
    protocol_version = "HTTP/1.1"
    engine = None  # set by serve()

    def log_message(self, fmt, *args):  # access log only at debug: one line a request is noise
        log.debug("%s " + fmt, self.address_string(), *args)

    def _json(self, status, body):
        raw = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _error(self, status, message):
        self._json(status, {"error": {"message": message, "code": status}})

    def do_GET(self):
        e = self.engine
        path = self.path.split("?", 1)[0]
        if path in ("/server_info", "/get_server_info"):
            return self._json(200, e.info())
        if path == "/model_info":
            m = e.model
            if m is None:
                return self._error(503, "model is loading")
            return self._json(200, {"model_path": e.args.model_path, "is_generation": True,
                                    "hidden_size": m.hidden_size, "num_layers": m.num_layers,
                                    "architectures": m.architectures})
        if path == "/health":
            if e.dead:
                return self._error(500, e.dead)
            if not e.ready.is_set():
                return self._error(503, "model is loading")
            return self._json(200, {})
        if path == "/health_generate":
            # As SGLang: answer only after a real forward, so a hung GPU shows as a hang.
            if not e.ready.is_set():
                return self._error(503, "model is loading")
            req = e.probe(Request(None, [0]))
            req.done.wait()
            if req.status != 200:
                return self._error(req.status, req.error)
            return self._json(200, {})
        self._error(404, f"no endpoint {path}")

    def do_POST(self):
        e = self.engine
        path = self.path.split("?", 1)[0]
        if path != "/generate":
            return self._error(404, f"no endpoint {path}")
        started = time.monotonic()
        try:
            n = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(n) or b"{}")
        except (ValueError, json.JSONDecodeError) as err:
            return self._error(400, f"request body is not JSON: {err}")
        if not e.ready.is_set():
            return self._error(503, "model is loading")
        if generation.is_generation(body):  # extract generate (generation.py)
            return generation.serve(self, e, body, started)
        rid, ids, msg = parse_generate(body, e.model)
        if msg:
            return self._error(400, msg)
        req, new = e.serving.admit(rid, ids)
        if req is None:
            return self._error(409, new)
        if new:
            e.submit(req)
        req.done.wait()
        if req.status != 200:
            return self._error(req.status, req.error)
        self._json(200, {
            "text": "",
            "output_ids": [],
            "meta_info": {"id": rid, "prompt_tokens": len(ids), "completion_tokens": 0,
                          "finish_reason": {"type": "length", "length": 0},
                          "e2e_latency": time.monotonic() - started},
        })


def parse_generate(body, model):
    """Returns (rid, ids, error message) for a /generate body."""
    if not isinstance(body, dict):
        return None, None, "request body must be a JSON object"
    rid = body.get("rid")
    try:
        writer.check_rid(rid)
    except ValueError as err:
        return None, None, str(err)
    ids, text = body.get("input_ids"), body.get("text")
    if (ids is None) == (text is None):
        return rid, None, "set exactly one of input_ids and text"
    if text is not None:
        if model.tokenizer is None:
            return rid, None, "this model folder has no tokenizer: give input_ids"
        if not isinstance(text, str):
            return rid, None, "text must be a string"
        ids = model.tokenizer(text)
    if not isinstance(ids, list) or not ids:
        return rid, None, "input_ids must be a non-empty list of integers"
    # An id outside the vocabulary would be a device-side assert on a GPU, which kills
    # the process: refuse it here instead. The common case in C (set, min, max: the GIL
    # this thread holds is the one the forward thread needs); the loop names the bad id.
    vocab = model.vocab_size
    if set(map(type, ids)) == {int} and min(ids) >= 0 and (vocab is None or max(ids) < vocab):
        return rid, ids, None
    for i in ids:
        if type(i) is not int or i < 0 or (vocab is not None and i >= vocab):
            return rid, None, f"input id {i!r} is not an integer in [0, {vocab})"
    return rid, ids, None


class Listener(ThreadingHTTPServer):
    """ThreadingHTTPServer with a listen backlog that holds a whole admission window.

    socketserver's default backlog is 5: the orchestrator opens up to max_inflight
    connections at once, and while the GIL is busy with a batch the accept thread falls
    behind, the queue overflows and clients see resets. SGLang's uvicorn listens with 2048.
    """

    request_queue_size = 2048
    daemon_threads = True
