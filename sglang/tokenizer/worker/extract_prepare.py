"""extract's prepare worker: conversations to input_ids and an exact assistant loss mask,
with the target's own tokenizer and chat template.

Shipped inside the extract binary and run by it in server.python. Protocol (JSON lines):
the first line on stdin is the config; the worker answers {"ready": true, ...} or
{"error": "..."}. With "worker_fds" ([[in, out], ...], descriptors extract passed) this
process loads the tokenizer once and forks one worker per pair, each serving its own
pair (the ready line lists their pids); without, it serves stdin and stdout itself.
Each request line is answered by one line:

  {"op": "encode", "convs": [{"messages": [...], "tools": [...]}]}
      -> {"results": [{"ids": [...], "mask": [...], "spans": [[start, end, loss, turn, rule]]}
                      | {"refused": {"reason": "...", "detail": "..."}}]}
  {"op": "pieces", "ids": [...]}  -> {"pieces": ["...", ...]}

A mask is exact or the conversation is refused with the reason: never an all-ones or an
all-zeros mask by default. Two methods (config "mask"):

  tags    the template's {% generation %} blocks, rendered once; the mask is what HF's
          apply_chat_template(..., return_assistant_tokens_mask=True) gives (same char to
          token rule); needs a fast tokenizer (offsets).
  prefix  render up to each turn boundary (the prompt with the generation prompt, then the
          prompt with the assistant turn) and require every render to be a token prefix of
          the whole conversation's; the assistant turn is the tokens between the two.

Then the end-of-turn convention (config "end_of_turn"): include puts the end-of-turn token
that closes each assistant turn in the loss, exclude leaves it out; tokens after it (a
template's newline between turns) are never in the loss.

Only stdout's protocol lines go to the real stdout; everything a library prints goes to
stderr, which extract keeps in its log.
"""

import bisect
import hashlib
import json
import os
import sys
import time
from datetime import datetime

BOOT = time.monotonic()

PROTOCOL = "1"

# The config line handed to this process again when it re-executes itself with torch.
HELLO_ENV, WITH_TORCH_ENV = "PREPARE_WORKER_HELLO", "PREPARE_WORKER_WITH_TORCH"


class Refused(Exception):
    def __init__(self, reason, detail):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def compile_template(source):
    """The chat template compiled as transformers compiles it (an immutable sandbox,
    trim_blocks, lstrip_blocks, loopcontrols, its tojson, raise_exception, strftime_now),
    plus the {% generation %} tracker: returns a render(**kw) -> (text, spans) function."""
    import jinja2
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    state = {"blocks": None, "spans": None}

    class GenerationTracker(Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_generation"), [], [], body).set_lineno(lineno)

        def _generation(self, caller):
            rv = caller()
            if state["blocks"] is not None:
                start = sum(len(b) for b in state["blocks"])
                state["spans"].append((start, start + len(rv)))
            return rv

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    template = env.from_string(source)

    def render(**kw):
        blocks, spans = [], []
        state["blocks"], state["spans"] = blocks, spans
        try:
            for block in template.generate(**kw):
                blocks.append(block)
        finally:
            state["blocks"], state["spans"] = None, None
        return "".join(blocks), spans

    return render


def has_generation_tags(source):
    import re
    return re.search(r"\{%-?\s*generation\s*-?%\}", source) is not None


class Worker:
    def __init__(self, cfg):
        t0 = time.monotonic()
        from transformers import AutoTokenizer

        t1 = time.monotonic()
        self.cfg = cfg
        self.tok = AutoTokenizer.from_pretrained(cfg["tokenizer"], local_files_only=True,
                                                 trust_remote_code=bool(cfg.get("trust_remote_code")))
        # Where a start's seconds go (extract logs them): the interpreter, the import, the load.
        self.timings = {"python_s": round(t0 - BOOT, 3), "import_s": round(t1 - t0, 3), "load_s": round(time.monotonic() - t1, 3),
                        "torch_imported": sys.modules.get("torch") is not None}
        source = None
        if cfg.get("chat_template_file"):
            with open(cfg["chat_template_file"], encoding="utf-8") as f:
                source = f.read()
        else:
            source = getattr(self.tok, "chat_template", None)
            if isinstance(source, dict):  # named templates: the default one
                source = source.get("default")
        if not source:
            raise RuntimeError("the tokenizer has no chat template and prepare.chat_template names no file")
        self.template_source = source
        self.render_template = compile_template(source)
        self.kwargs = dict(self.tok.special_tokens_map) if hasattr(self.tok, "special_tokens_map") else {}
        self.kwargs.update(cfg.get("template_kwargs") or {})
        fast = bool(getattr(self.tok, "is_fast", False))
        tags = has_generation_tags(source)
        method = cfg.get("mask", "auto")
        if method == "auto":
            method = "tags" if tags and fast else "prefix"
        if method == "tags" and not tags:
            raise RuntimeError("prepare.mask is tags but the chat template has no {% generation %} block")
        if method == "tags" and not fast:
            raise RuntimeError("prepare.mask is tags but the tokenizer is not a fast one (no offsets); use prefix")
        self.method = method
        self.include_eot = cfg.get("end_of_turn", "include") == "include"
        self.eot = self._end_of_turn_ids(cfg.get("end_of_turn_tokens") or [])
        backend = getattr(self.tok, "backend_tokenizer", None) if fast else None
        self.backend = backend if backend is not None and hasattr(backend, "encode_batch") else None

    def _end_of_turn_ids(self, names):
        ids = set()
        eos = getattr(self.tok, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        gen = os.path.join(self.cfg["tokenizer"], "generation_config.json")
        if os.path.isfile(gen):
            with open(gen, encoding="utf-8") as f:
                v = json.load(f).get("eos_token_id")
            for x in v if isinstance(v, list) else [v]:
                if isinstance(x, int):
                    ids.add(x)
        unk = getattr(self.tok, "unk_token_id", None)
        for name in names:
            i = self.tok.convert_tokens_to_ids(name)
            if i is None or (i == unk and name != getattr(self.tok, "unk_token", None)):
                raise RuntimeError(f"prepare.end_of_turn_tokens: {name!r} is not a token of this tokenizer")
            ids.add(i)
        if not ids:
            raise RuntimeError("no end-of-turn token: the tokenizer has no eos_token and prepare.end_of_turn_tokens is empty")
        return ids

    def ready(self):
        try:
            vocab = len(self.tok)
        except TypeError:
            vocab = getattr(self.tok, "vocab_size", 0)
        return {"ready": True, "protocol": PROTOCOL, "method": self.method, "fast": self.backend is not None,
                "vocab_size": vocab, "end_of_turn_ids": sorted(self.eot),
                "template_sha256": hashlib.sha256(self.template_source.encode()).hexdigest(), "timings": self.timings}

    # -- rendering and encoding

    def render(self, messages, tools, generation_prompt):
        try:
            return self.render_template(messages=messages, tools=tools or None, documents=None,
                                        add_generation_prompt=generation_prompt, **self.kwargs)
        except Exception as e:  # a template's raise_exception, or a bug in it
            raise Refused("template_error", f"the chat template raised {type(e).__name__}: {e}")

    def render_text(self, req):
        """extract generate: the template's text of the messages so far."""
        try:
            text, _ = self.render([to_hf(m) for m in req["messages"]], req.get("tools"), bool(req.get("generation_prompt")))
        except Refused as r:
            return {"refused": {"reason": r.reason, "detail": r.detail}}
        return {"text": text}

    def encode_texts(self, texts, offsets):
        if self.backend is not None:
            encs = self.backend.encode_batch(texts, add_special_tokens=False)
            return [e.ids for e in encs], ([e.offsets for e in encs] if offsets else None)
        out = self.tok(texts, add_special_tokens=False, return_offsets_mapping=offsets)
        return out["input_ids"], (out["offset_mapping"] if offsets else None)

    # -- the two methods; each returns (ids, mask, spans) for one conversation

    def encode_batch(self, convs):
        results = [None] * len(convs)
        plans = []
        for i, c in enumerate(convs):
            try:
                plans.append((i, self.plan(c)))
            except Refused as r:
                results[i] = {"refused": {"reason": r.reason, "detail": r.detail}}
        texts = [t for _, p in plans for t in p["texts"]]
        ids, offs = self.encode_texts(texts, self.method == "tags") if texts else ([], None)
        at = 0
        for i, p in plans:
            n = len(p["texts"])
            try:
                if self.method == "tags":
                    results[i] = self.finish_tags(p, ids[at], offs[at])
                else:
                    results[i] = self.finish_prefix(p, ids[at:at + n])
            except Refused as r:
                results[i] = {"refused": {"reason": r.reason, "detail": r.detail}}
            at += n
        return results

    def plan(self, conv):
        messages = [to_hf(m) for m in conv["messages"]]
        tools = conv.get("tools")
        assistants = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
        if self.method == "tags":
            text, spans = self.render(messages, tools, False)
            if len(spans) != len(assistants):
                raise Refused("empty_mask", f"the template's generation blocks cover {len(spans)} spans for {len(assistants)} assistant turns")
            for k, (a, b) in zip(assistants, spans):
                self.check_reasoning(messages[k], text[a:b], k)
            return {"texts": [text], "spans": spans, "assistants": assistants}
        full, _ = self.render(messages, tools, False)
        texts, bounds = [full], []
        for k in assistants:
            prompt, _ = self.render(messages[:k], tools, True)
            if k == assistants[0] and prompt == self.render(messages[:k], tools, False)[0]:
                # Without a generation prompt the assistant's header would count as its turn.
                raise Refused("template_error", "the template renders no generation prompt (add_generation_prompt changes nothing): the assistant's header cannot be told from its turn; use a template that has one, or generation tags")
            turn, _ = self.render(messages[:k + 1], tools, False)
            if not turn.startswith(prompt):
                raise Refused("not_a_token_prefix", f"turn {k}: the prompt with the generation prompt is not a prefix of the prompt with the assistant turn (the generation prompt differs from how the template renders the turn)")
            if not full.startswith(turn):
                raise Refused("not_a_token_prefix", f"turn {k}: the template renders this assistant turn differently once later turns follow (e.g. it drops earlier reasoning)")
            self.check_reasoning(messages[k], turn[len(prompt):], k)
            bounds.append(k)
            texts += [prompt, turn]
        return {"texts": texts, "assistants": bounds}

    def check_reasoning(self, message, rendered, turn):
        r = message.get("reasoning_content")
        if r and r.strip() and r.strip() not in rendered:
            raise Refused("template_error", f"turn {turn}: the template does not render its reasoning_content (set prepare.reasoning: drop to train without it)")

    def finish_prefix(self, p, encoded):
        full = encoded[0]
        mask = [0] * len(full)
        spans = []
        prev = 0
        for j, k in enumerate(p["assistants"]):
            prompt, turn = encoded[1 + 2 * j], encoded[2 + 2 * j]
            for name, part in (("the prompt", prompt), ("the assistant turn", turn)):
                if len(part) > len(full) or full[:len(part)] != part:
                    raise Refused("not_a_token_prefix", f"turn {k}: {name} does not tokenize to a prefix of the whole conversation's tokens")
            a, b = len(prompt), len(turn)
            if a < prev or b <= a:
                raise Refused("not_a_token_prefix", f"turn {k}: the assistant turn is {b - a} tokens after token {a}")
            end = self.turn_end(full, a, b, k)
            add_span(spans, prev, a, False, -1, "prompt")
            mask[a:end] = [1] * (end - a)
            body = end - 1 if self.include_eot else end
            add_span(spans, a, body, True, k, "assistant turn (token prefix)")
            add_span(spans, body, end, self.include_eot, k, "end of turn (prepare.end_of_turn: include)")
            if not self.include_eot:
                add_span(spans, end, end + 1, False, k, "end of turn (prepare.end_of_turn: exclude)")
                end += 1
            add_span(spans, end, b, False, k, "after the end of turn")
            prev = b
        add_span(spans, prev, len(full), False, -1, "prompt")
        return {"ids": full, "mask": mask, "spans": spans}

    def turn_end(self, ids, a, b, k):
        """The end of the turn's loss span: just past (include) or at (exclude) the last
        end-of-turn token within [a, b)."""
        for t in range(b - 1, a - 1, -1):
            if ids[t] in self.eot:
                return t + 1 if self.include_eot else t
        raise Refused("no_end_of_turn", f"turn {k}: no end-of-turn token ({sorted(self.eot)}) closes the assistant turn; name it in prepare.end_of_turn_tokens")

    def finish_tags(self, p, ids, offsets):
        """The tokens of each generation block: those whose characters lie in it. That is
        HF's char_to_token rule (the token holding the block's first character through the
        one holding its last) except where a character is split across tokens (bytes of a
        rare character): HF keeps only the first of them at the block's end, this keeps
        all. A token that holds characters both inside and outside a block cannot be
        masked exactly: the conversation is refused."""
        mask = [0] * len(ids)
        starts, ends = (list(x) for x in zip(*offsets)) if offsets else ([], [])
        if starts != sorted(starts) or ends != sorted(ends):  # sorted() runs in C: cheaper than a loop
            raise Refused("template_error", "the tokenizer's offsets are not in order; use prepare.mask: prefix")

        def tokens_of(a, b):
            first = bisect.bisect_right(ends, a)  # the first token ending after a
            last = bisect.bisect_left(starts, b) - 1  # the last token starting before b
            return first, last

        runs = []
        for k, (a, b) in zip(p["assistants"], p["spans"]):
            if b <= a:
                raise Refused("empty_mask", f"turn {k}: the generation block renders nothing")
            start, end = tokens_of(a, b)
            if start > end:
                raise Refused("empty_mask", f"turn {k}: the generation block's characters {a}-{b} map to no token")
            if starts[start] < a or ends[end] > b:
                raise Refused("token_crosses_turn_boundary", f"turn {k}: a token holds characters both inside and outside the generation block ({a}-{b})")
            mask[start:end + 1] = [1] * (end + 1 - start)
            runs.append((k, start, end + 1))
        spans = []
        prev = 0
        for k, a, b in runs:
            rule = "generation tags"
            add_span(spans, prev, a, False, -1, "outside the generation tags")
            if self.include_eot and b < len(ids) and ids[b] in self.eot and ids[b - 1] not in self.eot:
                add_span(spans, a, b, True, k, rule)
                mask[b] = 1
                add_span(spans, b, b + 1, True, k, "end of turn after the generation tags (prepare.end_of_turn: include)")
                b += 1
            elif not self.include_eot and ids[b - 1] in self.eot:
                mask[b - 1] = 0
                add_span(spans, a, b - 1, True, k, rule)
                add_span(spans, b - 1, b, False, k, "end of turn (prepare.end_of_turn: exclude)")
            else:
                add_span(spans, a, b, True, k, rule)
            prev = max(prev, b)
        add_span(spans, prev, len(ids), False, -1, "outside the generation tags")
        if not any(mask):
            raise Refused("empty_mask", "the generation tags cover no token")
        return {"ids": ids, "mask": mask, "spans": spans}

    def exercise(self):
        """One encode and one decode before the workers fork: a tokenizer whose code
        imports torch only when it runs fails here, where the load can still be retried
        with torch, not in every worker's first batch."""
        ids, _ = self.encode_texts(["a"], True)
        self.tok.decode(ids[0])

    def pieces(self, ids):
        return [self.tok.decode([i]) for i in ids]


def add_span(spans, a, b, loss, turn, rule):
    if b > a:
        spans.append([a, b, bool(loss), turn, rule])


def to_hf(m):
    out = {"role": m["role"], "content": m.get("content", "")}
    if m.get("reasoning_content"):
        out["reasoning_content"] = m["reasoning_content"]
    if m.get("tool_calls"):
        out["tool_calls"] = m["tool_calls"]
    for k in ("tool_call_id", "name"):
        if m.get(k):
            out[k] = m[k]
    return out


def write_line(proto, obj):
    """One protocol line, flushed: extract reads a line per request."""
    proto.write(json.dumps(obj, separators=(",", ":")) + "\n")
    proto.flush()


def serve(worker, index, requests, proto):
    """Answers request lines until EOF. Where the worker's time went goes to stderr as one
    line at the end (extract logs it): busy in requests, or waiting for the next one (the
    orchestrator's side is then the limit)."""

    def reply(obj):
        write_line(proto, obj)

    started, busy, convs, first = time.monotonic(), 0.0, 0, None
    for line in requests:
        t = time.monotonic()
        first = t if first is None else first
        req = json.loads(line)
        convs += len(req.get("convs") or ())
        if req["op"] == "encode":
            reply({"results": worker.encode_batch(req["convs"])})
        elif req["op"] == "render_text":
            reply(worker.render_text(req))
        elif req["op"] == "encode_text":
            reply({"ids": list(worker.encode_texts([req["text"]], False)[0][0])})
        elif req["op"] == "pieces":
            reply({"pieces": worker.pieces(req["ids"])})
        else:
            reply({"error": f"unknown op {req['op']!r}"})
        busy += time.monotonic() - t
    end = time.monotonic()
    stats = json.dumps({"startup_s": round(started - BOOT, 3), "busy_s": round(busy, 3),
                        "idle_s": round(end - (first or end) - busy, 3), "waiting_for_first_s": round((first or end) - started, 3),
                        "conversations": convs})
    # print's two writes (the text, then the newline) of 16 workers ending at once came
    # out interleaved.
    log_line(f"extract-prepare: worker {index} stats {stats}")


def log_line(text):
    """One stderr line in one write: the workers and the zygote share the pipe, and a
    line written in pieces comes out interleaved with another's."""
    sys.stderr.flush()
    os.write(2, (text.rstrip("\n") + "\n").encode("utf-8", "replace"))


def pdeathsig():
    """prctl(PR_SET_PDEATHSIG, SIGKILL) as a function a forked child calls: resolved in
    the zygote, so that no child loads a library after the fork; None where there is none."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except Exception as e:  # not Linux: EOF on its requests still ends a worker
        log_line(f"extract-prepare: no PR_SET_PDEATHSIG ({e})")
        return None

    def set_it():
        if prctl(1, 9) != 0:  # PR_SET_PDEATHSIG, SIGKILL
            return os.strerror(ctypes.get_errno())
        return None
    return set_it


def die_with_parent(parent, set_pdeathsig):
    """A forked worker ends with the process that forked it, not only at EOF: a worker
    busy in a long batch would otherwise outlive a killed pool."""
    if set_pdeathsig is not None:
        err = set_pdeathsig()
        if err:
            log_line(f"extract-prepare: PR_SET_PDEATHSIG failed: {err}")
    if os.getppid() != parent:  # the parent died before the prctl
        os._exit(1)


def fork_workers(worker, fds, proto):
    """The zygote: the tokenizer loaded once (importing transformers is most of a start),
    then one forked worker per pair of descriptors extract passed. It reports how each
    ended and exits once all have."""
    zygote, pids = os.getpid(), {}
    set_pdeathsig = pdeathsig()
    sys.stderr.flush()  # or each child would print what the zygote had buffered again
    for i, (rfd, wfd) in enumerate(fds):
        pid = os.fork()
        if pid == 0:
            die_with_parent(zygote, set_pdeathsig)
            proto.close()
            for j, pair in enumerate(fds):
                if j != i:
                    for fd in pair:
                        os.close(fd)
            rc = 0
            try:
                serve(worker, i, os.fdopen(rfd, "r", encoding="utf-8"), os.fdopen(wfd, "w", encoding="utf-8"))
            except BaseException as e:  # the traceback is what extract's error quotes
                import traceback
                log_line(traceback.format_exc())
                log_line(f"extract-prepare: worker {i} failed: {type(e).__name__}: {e}")
                rc = 1
            sys.stderr.flush()
            os._exit(rc)  # no interpreter teardown: with transformers loaded it takes a second
        pids[pid] = i
    for pair in fds:
        for fd in pair:
            os.close(fd)
    return pids


def import_failed(e):
    """Whether e, or an exception it came from, is an ImportError: what hiding torch
    causes. Any other failure (no template, a bad option) is the same with torch."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, ImportError):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def describe(status):
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"


def main():
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # libraries that print reach stderr, never the protocol
    sys.stdout = sys.stderr

    def reply(obj):
        write_line(proto, obj)

    hello = os.environ.pop(HELLO_ENV, None) or sys.stdin.readline()
    # Torch hidden from transformers: a tokenizer needs none of it, and importing it was
    # 13 of a 14 s start on the device (transformers 5 imports it with AutoTokenizer).
    # A tokenizer whose load fails without torch is loaded again with it, in a fresh
    # interpreter (this process exec'ed with the same config).
    hide_torch = not os.environ.get(WITH_TORCH_ENV)
    if hide_torch:
        sys.modules["torch"] = None  # find_spec("torch") is None: transformers sees no torch
    try:
        cfg = json.loads(hello)
        worker = Worker(cfg)
        worker.exercise()
    except Exception as e:
        if hide_torch and import_failed(e):
            log_line(f"extract-prepare: the tokenizer did not load with torch hidden ({type(e).__name__}: {e}); loading it again with torch")
            proto.flush()
            os.dup2(proto.fileno(), 1)  # the protocol's stdout, as this process got it
            os.execve(sys.executable, [sys.executable, os.path.abspath(__file__)],
                      dict(os.environ, **{HELLO_ENV: hello, WITH_TORCH_ENV: "1"}))
        reply({"error": f"{type(e).__name__}: {e}"})
        return 1
    worker.timings["torch_hidden"] = hide_torch
    fds = cfg.get("worker_fds")
    if not fds:  # one worker on stdin and stdout (a person at a shell)
        reply(worker.ready())
        serve(worker, 0, sys.stdin, proto)
        return 0
    pids = fork_workers(worker, fds, proto)
    reply(dict(worker.ready(), pids=sorted(pids, key=pids.get)))
    proto.close()
    failed = 0
    while pids:
        pid, status = os.wait()
        i = pids.pop(pid, None)
        if i is not None and status != 0:
            failed = 1
            log_line(f"extract-prepare: worker {i} exited: {describe(status)}")
    sys.stderr.flush()
    os._exit(failed)


if __name__ == "__main__":
    sys.exit(main())
