#!/usr/bin/env python3
"""Check extract's draft vocabulary against SpecForge's own function.

    python3 scripts/check_vocab_mapping.py OUTPUT_DIR/vocab_mapping --samples SAMPLES.jsonl \
        --draft N --target N --specforge ../shared/specforge-src

SAMPLES.jsonl holds the done samples' {"input_ids", "loss_mask"} in sample order (a
prepared dataset.jsonl is one). The token counts are made as SpecForge's
generate_vocab_mapping_file makes them (a Counter updated sample by sample with the
sorted unique loss tokens), then specforge.data.preprocessing.process_token_dict_to_mappings
runs on them; its d2t and t2d must equal vocab_mapping.pt's, loaded with
torch.load(weights_only=True), and token_freq.pt must equal the counts. SpecForge's
module is loaded from its file with the imports this check does not use stubbed, so
only its own function runs. Prints a JSON summary; exit 1 on any difference.
"""

import argparse
import importlib.util
import json
import sys
import types
from collections import Counter



def load_specforge(src):
    """specforge.data.preprocessing without its heavy imports (datasets, transformers,
    the distributed and parsing modules): stubs stand in for names it only imports."""
    def stub(name, **attrs):
        m = types.ModuleType(name)
        m.__path__ = []
        for k, v in attrs.items():
            setattr(m, k, v)
        sys.modules.setdefault(name, m)

    anything = type("Stub", (), {})
    stub("datasets", Dataset=anything)
    stub("tqdm", tqdm=lambda it, **kw: it)
    stub("transformers", PreTrainedTokenizer=anything)
    stub("specforge")
    stub("specforge.distributed", get_draft_sp_group=None, get_sp_ring_group=None)
    stub("specforge.data")
    stub("specforge.data.loss_mask", has_consecutive_supervised_tokens=None)
    stub("specforge.data.parse", GeneralParser=anything, GLMParser=anything, HarmonyParser=anything, ThinkingParser=anything)
    stub("specforge.data.template", TEMPLATE_REGISTRY={}, ChatTemplate=anything)
    spec = importlib.util.spec_from_file_location("specforge.data.preprocessing", f"{src}/specforge/data/preprocessing.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["specforge.data.preprocessing"] = mod
    spec.loader.exec_module(mod)
    return mod


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mapping_dir")
    ap.add_argument("--samples", required=True)
    ap.add_argument("--draft", type=int, required=True)
    ap.add_argument("--target", type=int, required=True)
    ap.add_argument("--specforge", required=True)
    a = ap.parse_args()
    global torch
    import torch  # after the arguments: --help needs no torch
    pre = load_specforge(a.specforge)
    token_dict = Counter()
    with open(a.samples) as f:
        for line in f:
            s = json.loads(line)
            ids, mask = torch.tensor(s["input_ids"]), torch.tensor(s["loss_mask"])
            unique_ids, counts = ids[mask == 1].unique(return_counts=True)
            token_dict.update(dict(zip(unique_ids.tolist(), counts.tolist())))
    counts = dict(token_dict)
    import contextlib, io
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its ratios
        d2t, t2d = pre.process_token_dict_to_mappings(token_dict, a.draft, a.target)
    got = torch.load(f"{a.mapping_dir}/vocab_mapping.pt", map_location="cpu", weights_only=True)
    freq = torch.load(f"{a.mapping_dir}/token_freq.pt", map_location="cpu", weights_only=True)
    problems = []
    if set(got) != {"d2t", "t2d"}:
        problems.append(f"keys {sorted(got)}")
    if got["d2t"].dtype != torch.int64 or tuple(got["d2t"].shape) != (a.draft,):
        problems.append(f"d2t {got['d2t'].dtype} {tuple(got['d2t'].shape)}")
    if got["t2d"].dtype != torch.bool or tuple(got["t2d"].shape) != (a.target,):
        problems.append(f"t2d {got['t2d'].dtype} {tuple(got['t2d'].shape)}")
    if not problems and not torch.equal(got["d2t"], d2t):
        problems.append(f"d2t differs at {(got['d2t'] != d2t).nonzero().flatten()[:10].tolist()}")
    if not problems and not torch.equal(got["t2d"], t2d):
        problems.append(f"t2d differs at {(got['t2d'] != t2d).nonzero().flatten()[:10].tolist()}")
    if freq != counts:
        problems.append(f"token_freq has {len(freq)} tokens, the samples {len(counts)}")
    print(json.dumps({"ok": not problems, "problems": problems, "tokens_seen": len(counts), "draft": a.draft, "target": a.target}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
