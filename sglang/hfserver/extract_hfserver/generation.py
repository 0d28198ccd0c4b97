"""extract generate's requests on the transformers server: a /generate whose rid starts
with "g" (extract generate's rids; dumps are only for protocol v1 rids "s...") runs
model.generate on input_ids with SGLang's sampling_params and answers in SGLang's shape:
{"text", "output_ids", "meta_info": {"id", "prompt_tokens", "completion_tokens",
"finish_reason": {"type": "stop", "matched": id} | {"type": "length", "length": n}}}.

output_ids are the ids generated, the stop token included when one ended the reply (as
SGLang's); text is their decoding without that stop token. Generations run one at a time
beside the dump batches (a lock), each alone, so greedy output is model.generate's for
that prompt exactly; a sampled one is seeded from sampling_seed.
"""

import threading
import time

_lock = threading.Lock()
_tokenizers = {}


def is_generation(body):
    return isinstance(body, dict) and isinstance(body.get("rid"), str) and body["rid"].startswith("g")


def _tokenizer(path):
    if path not in _tokenizers:
        try:
            from transformers import AutoTokenizer

            _tokenizers[path] = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except Exception:  # a backend without a tokenizer folder: the text stays empty
            _tokenizers[path] = None
    return _tokenizers[path]


def parse(body, vocab_size):
    """Returns (rid, ids, sampling dict, error message)."""
    rid, ids = body.get("rid"), body.get("input_ids")
    if not isinstance(ids, list) or not ids:
        return rid, None, None, "input_ids must be a non-empty list of integers"
    for i in ids:
        if type(i) is not int or i < 0 or (vocab_size is not None and i >= vocab_size):
            return rid, None, None, f"input id {i!r} is not an integer in [0, {vocab_size})"
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, dict):
        return rid, None, None, "sampling_params must be an object"
    out = {
        "max_new_tokens": sp.get("max_new_tokens", 128),
        "temperature": float(sp.get("temperature", 1.0)),
        "top_p": float(sp.get("top_p", 1.0)),
        "top_k": int(sp.get("top_k", -1)),
        "seed": sp.get("sampling_seed"),
        "stop_token_ids": sp.get("stop_token_ids") or [],
        "skip_special_tokens": bool(sp.get("skip_special_tokens", True)),
    }
    n = out["max_new_tokens"]
    if type(n) is not int or n < 1:
        return rid, None, None, f"sampling_params.max_new_tokens must be a positive integer, got {n!r}"
    if out["temperature"] < 0 or not 0 < out["top_p"] <= 1:
        return rid, None, None, "sampling_params: temperature must be >= 0 and top_p in (0, 1]"
    return rid, ids, out, None


def generate(backend, model_path, ids, sp):
    """Returns (output_ids, finish_reason, text)."""
    import torch

    model = backend.model
    cfg = model.generation_config
    eos = cfg.eos_token_id if cfg is not None else None
    stops = set(eos if isinstance(eos, list) else ([eos] if eos is not None else []))
    stops.update(int(i) for i in sp["stop_token_ids"])
    kw = {"max_new_tokens": sp["max_new_tokens"], "eos_token_id": sorted(stops) or None,
          "pad_token_id": sorted(stops)[0] if stops else 0}
    if sp["temperature"] == 0:
        kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    else:
        kw.update(do_sample=True, temperature=sp["temperature"], top_p=sp["top_p"], top_k=sp["top_k"] if sp["top_k"] > 0 else 0)
    device = getattr(backend, "device", None) or next(model.parameters()).device
    x = torch.tensor([ids], dtype=torch.long, device=device)
    with _lock, torch.inference_mode():
        if sp["seed"] is not None:
            torch.manual_seed(int(sp["seed"]))
        y = model.generate(input_ids=x, attention_mask=torch.ones_like(x), **kw)
    out = y[0, len(ids):].tolist()
    if out and out[-1] in stops:
        finish, body = {"type": "stop", "matched": out[-1]}, out[:-1]
    else:
        finish, body = {"type": "length", "length": len(out)}, out
    tok = _tokenizer(model_path)
    text = tok.decode(body, skip_special_tokens=sp["skip_special_tokens"]) if tok is not None else ""
    return out, finish, text


def serve(handler, engine, body, started):
    """Answers one generation request on handler."""
    m = engine.model
    if not hasattr(getattr(m, "model", None), "generate"):
        return handler._error(400, f"backend {getattr(m, 'name', type(m).__name__)} cannot generate")
    rid, ids, sp, msg = parse(body, getattr(m, "vocab_size", None))
    if msg:
        return handler._error(400, msg)
    try:
        out, finish, text = generate(m, engine.args.model_path, ids, sp)
    except Exception as e:  # a CUDA OOM or a bad config: this request fails, the server lives
        return handler._error(500, f"generate failed: {type(e).__name__}: {e}")
    handler._json(200, {"text": text, "output_ids": out, "meta_info": {
        "id": rid, "prompt_tokens": len(ids), "completion_tokens": len(out), "finish_reason": finish,
        "e2e_latency": time.monotonic() - started}})
