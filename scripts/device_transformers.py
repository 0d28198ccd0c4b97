#!/usr/bin/env python3
"""Helper of scripts/device_transformers.sh (H200, torch and transformers present).

  make-model DIR --layers N --hidden H --intermediate I --heads A --vocab V
      a randomly initialised LlamaForCausalLM (fixed seed, no download), bf16, saved
      with save_pretrained (safetensors, no tokenizer)
  make-data FILE --samples N --min-len A --max-len B --vocab V
  check MODEL DATASET OUTPUT_DIR SERVER_LOG --layers a,b,c --mode exact|batched
      compares every output file with offline forwards of the same model:
        per-sample reference: model(input_ids, output_hidden_states=True), the causal
          LM's own forward, one sample at a time, no attention mask
        replay reference (batched runs): the server's batch as its log names it, padded
          the same way, through the same base-model call
      exact mode wants the per-sample reference bit for bit (the server ran one request
      a forward, so the math is the same); batched mode wants the replay bit for bit
      and the per-sample reference within bf16 rounding (other GEMM shapes and a
      padding mask change the summation order).
      It also proves the layer-index convention on this transformers: hidden_states[k]
      is bit for bit the input of decoder layer k (a forward pre-hook), and the last
      entry is the final norm's output.
  forward-rate MODEL DATASET --layers a,b,c [--max-batch-tokens T --max-batch-requests R --window W]
      the GPU's forward-only rate, tokens/s, over the batches the server would form on
      DATASET, and the peak memory of the capture against output_hidden_states
"""

import argparse
import glob
import json
import os
import random
import re
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def load(model_dir):
    import torch
    import transformers

    # The server's own loader, so the reference loads exactly as the server does.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sglang", "hfserver"))
    from extract_hfserver import backend

    return backend.load_transformers(model_dir, backend.Options()).model


def make_model(a):
    import torch
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
        num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.heads,
        max_position_embeddings=4096, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(cfg)
    model = model.to(torch.bfloat16)
    model.save_pretrained(a.dir)  # safetensors, the default
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({"model": a.dir, "params": n, "weight_bytes": 2 * n, "layers": a.layers, "hidden": a.hidden}))


def make_data(a):
    rng = random.Random(1)
    tokens = 0
    with open(a.file, "w") as f:
        for _ in range(a.samples):
            n = rng.randint(a.min_len, a.max_len)
            tokens += n
            f.write(json.dumps({"input_ids": [rng.randrange(a.vocab) for _ in range(n)]}) + "\n")
    print(json.dumps({"dataset": a.file, "samples": a.samples, "tokens": tokens}))


def read_outputs(out_dir):
    from safetensors import safe_open

    files = {}
    for path in glob.glob(os.path.join(out_dir, "rows_*", "data_*.safetensors")):
        idx = int(re.search(r"data_(\d+)\.safetensors$", path).group(1))
        files[idx] = path
    return files


def open_output(path):
    from safetensors import safe_open

    with safe_open(path, "pt", device="cpu") as f:
        meta = f.metadata()
        return meta, {k: f.get_tensor(k) for k in f.keys()}


def read_batches(log_path):
    """rid -> list of (batch width, [rid or None, ...]) from the server's batch lines."""
    pat = re.compile(r"batch \d+: width (\d+) rids (\S+)")
    by_rid = {}
    # Each launch rotates the log to server.log.1 ... .5: a restarted server's batches
    # before the kill are there.
    paths = [log_path] + [f"{log_path}.{i}" for i in range(1, 6)]
    for line in (l for p in paths if os.path.exists(p) for l in open(p, errors="replace")):
        m = pat.search(line)
        if not m:
            continue
        rids = [None if r == "-" else r for r in m.group(2).split(",")]
        for r in rids:
            if r:
                by_rid.setdefault(r, []).append((int(m.group(1)), rids))
    return by_rid


def convention(model, ids, layers):
    """Checks on this transformers that hidden_states[k] is the input of decoder layer k."""
    import torch

    inputs = {}
    hooks = [layer.register_forward_pre_hook(lambda mod, args, kw, k=k: inputs.__setitem__(k, (args[0] if args else kw["hidden_states"]).clone()), with_kwargs=True)
             for k, layer in enumerate(model.model.layers)]
    last_out = {}
    hooks.append(model.model.norm.register_forward_hook(lambda mod, args, out: last_out.__setitem__("norm", out.clone())))
    try:
        with torch.inference_mode():
            hs = model(ids, output_hidden_states=True).hidden_states
    finally:
        for h in hooks:
            h.remove()
    ok = all(torch.equal(hs[k], inputs[k]) for k in layers) and torch.equal(hs[-1], last_out["norm"])
    return ok, len(hs)


def check(a):
    import torch

    layers = [int(x) for x in a.layers.split(",")]
    model = load(a.model)
    dev = next(model.parameters()).device
    samples = [json.loads(line)["input_ids"] for line in open(a.dataset)]
    files = read_outputs(a.output)
    batches = read_batches(a.server_log) if a.mode == "batched" else {}
    conv_ok, n_hs = convention(model, torch.tensor([samples[0]], device=dev), layers)
    res = {"samples": len(samples), "files": len(files), "missing": 0, "ids_wrong": 0,
           "per_sample_bit_exact": 0, "replay_bit_exact": 0, "within_bf16": 0, "max_abs_diff": 0.0,
           "max_rel_diff": 0.0, "hidden_states_entries": n_hs, "convention_verified": conv_ok}
    final_rid = {}  # rid of each output -> its (aux, final), until a replay matches it
    for idx, ids in enumerate(samples):
        path = files.get(idx)
        if path is None:
            res["missing"] += 1
            continue
        meta, t = open_output(path)
        if t["input_ids"].tolist() != ids:
            res["ids_wrong"] += 1
            continue
        with torch.inference_mode():
            hs = model(torch.tensor([ids], device=dev), output_hidden_states=True).hidden_states
        ref_aux = torch.cat([hs[k][0] for k in layers], -1).cpu()
        ref_final = hs[-1][0].cpu()
        got_aux, got_final = t["aux_hidden_state"], t["hidden_state"]
        if torch.equal(got_aux, ref_aux) and torch.equal(got_final, ref_final):
            res["per_sample_bit_exact"] += 1
        # bf16 keeps 8 significant bits: allow a few units in the last place of each
        # value, plus an absolute floor at 1% of the tensor's RMS for values near 0.
        ok = True
        for got, ref in ((got_aux, ref_aux), (got_final, ref_final)):
            g, r = got.float(), ref.float()
            diff = (g - r).abs()
            rms = r.pow(2).mean().sqrt().item()
            res["max_abs_diff"] = max(res["max_abs_diff"], diff.max().item())
            res["max_rel_diff"] = max(res["max_rel_diff"], (diff.max() / max(rms, 1e-30)).item())
            if not bool((diff <= 4 * 2.0 ** -8 * r.abs() + 0.01 * rms).all()):
                ok = False
        res["within_bf16"] += ok
        final_rid[meta.get("rid")] = (got_aux, got_final)
    if a.mode == "batched":
        # Each logged batch that made a final output is replayed once, in log order.
        seen = set()
        for rid in list(final_rid):
            for width, rids in batches.get(rid, []):
                key = (width, tuple(rids))
                if key in seen:
                    continue
                seen.add(key)
                out = replay(model, dev, samples, rids, width, layers)
                for r, (ra, rf) in out.items():
                    got = final_rid.get(r)
                    if got is not None and torch.equal(got[0], ra) and torch.equal(got[1], rf):
                        res["replay_bit_exact"] += 1
                        del final_rid[r]
        res["replayed_batches"] = len(seen)
    n = len(samples)
    if a.mode == "exact":
        res["pass"] = res["missing"] == 0 and res["ids_wrong"] == 0 and res["per_sample_bit_exact"] == n and conv_ok
        res["claim"] = "bit for bit equal to model(input_ids, output_hidden_states=True), one sample a forward"
    else:
        res["pass"] = res["missing"] == 0 and res["ids_wrong"] == 0 and res["replay_bit_exact"] == n and conv_ok
        res["claim"] = ("bit for bit equal to an offline replay of the server's batch; against the per-sample "
                        "forward, within_bf16 counts outputs within 4 bf16 ulps (+1% of RMS), reported, not required")
    print(json.dumps(res))
    return 0 if res["pass"] else 1


def replay(model, dev, samples, rids, width, layers):
    import torch

    rows = []
    for r in rids:
        rows.append([0] if r is None else samples[int(r[1:10])])
    ids = torch.zeros((len(rows), width), dtype=torch.int64)
    mask = torch.zeros((len(rows), width), dtype=torch.int64)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    with torch.inference_mode():
        out = model.base_model(input_ids=ids.to(dev), attention_mask=mask.to(dev), output_hidden_states=True, use_cache=False, return_dict=True)
    aux = torch.cat([out.hidden_states[k] for k in layers], -1).to(torch.bfloat16).cpu()
    final = out.last_hidden_state.to(torch.bfloat16).cpu()
    return {r: (aux[i, : len(rows[i])], final[i, : len(rows[i])]) for i, r in enumerate(rids) if r}


def forward_rate(a):
    """The forward-only rate of the batches the server would run on this dataset:
    windows of --window requests in dataset order, sorted by length and cut under the
    same budget (the server's own plan_window), right-padded, the base model's forward
    with the attention mask and nothing captured. Also the GPU memory one of the largest
    batches peaks at with the server's capture (pre-hooks on the three layers) against
    output_hidden_states=True."""
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sglang", "hfserver"))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sglang", "hook"))
    from extract_hfserver import backend, server

    be = backend.load_transformers(a.model, backend.Options())
    model, dev = be.model, be.device
    samples = [json.loads(line)["input_ids"] for line in open(a.dataset)]

    class R:
        def __init__(self, ids):
            self.ids = ids

    batches = []
    for at in range(0, len(samples), a.window):
        batches += server.plan_window([R(x) for x in samples[at : at + a.window]], a.max_batch_tokens, a.max_batch_requests)
    tensors = []
    for b in batches:
        width = max(len(r.ids) for r in b)
        ids = torch.zeros((len(b), width), dtype=torch.int64)
        mask = torch.zeros((len(b), width), dtype=torch.int64)
        for i, r in enumerate(b):
            ids[i, : len(r.ids)] = torch.tensor(r.ids)
            mask[i, : len(r.ids)] = 1
        tensors.append((ids.to(dev), mask.to(dev)))
    tokens = sum(len(x) for x in samples)
    with torch.inference_mode():
        for ids, mask in tensors[:2]:
            model.base_model(input_ids=ids, attention_mask=mask, use_cache=False)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for ids, mask in tensors:
            model.base_model(input_ids=ids, attention_mask=mask, use_cache=False)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    layers = [int(x) for x in a.layers.split(",")]
    big = max(tensors, key=lambda t: t[0].numel())
    peaks = {}
    for name, fn in (("capture_hooks", lambda: be.capture(*big, layers)), ("output_hidden_states", lambda: be.forward(*big))):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        out = fn()
        torch.cuda.synchronize()
        peaks[name] = round((torch.cuda.max_memory_allocated() - base) / 2**30, 3)
        del out
    padded = sum(t[0].numel() for t in tensors)
    print(json.dumps({"forward_tokens_per_second": tokens / dt, "batches": len(tensors), "tokens": tokens,
                      "padding_efficiency": round(tokens / padded, 3), "seconds": round(dt, 3),
                      "peak_gib_largest_batch": peaks, "largest_batch": list(big[0].shape)}))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make-model")
    m.add_argument("dir")
    for k, v in (("layers", 4), ("hidden", 256), ("intermediate", 512), ("heads", 4), ("vocab", 1000)):
        m.add_argument("--" + k, type=int, default=v)
    d = sub.add_parser("make-data")
    d.add_argument("file")
    for k, v in (("samples", 64), ("min-len", 4), ("max-len", 200), ("vocab", 1000)):
        d.add_argument("--" + k, type=int, default=v)
    c = sub.add_parser("check")
    for k in ("model", "dataset", "output", "server_log"):
        c.add_argument(k)
    c.add_argument("--layers", required=True)
    c.add_argument("--mode", choices=("exact", "batched"), required=True)
    f = sub.add_parser("forward-rate")
    f.add_argument("model")
    f.add_argument("dataset")
    f.add_argument("--layers", required=True)
    f.add_argument("--max-batch-tokens", type=int, default=16384)
    f.add_argument("--max-batch-requests", type=int, default=64)
    f.add_argument("--window", type=int, default=256)
    a = p.parse_args()
    return {"make-model": make_model, "make-data": make_data, "check": check, "forward-rate": forward_rate}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main())
