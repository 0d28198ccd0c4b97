#!/usr/bin/env python3
"""Check extract's torch-format outputs with real torch and SpecForge's own reader.

    python3 scripts/check_torch_formats.py OUT_DIR --reference REF_DIR [--specforge SRC] [--collate N]

OUT_DIR holds specforge (.ckpt / .ckpt.gz) or modelopt (.pt) files; REF_DIR is the same
samples in extract's safetensors layout (extract export --format safetensors --to REF_DIR,
or a second job), read here with no library but json. Every file is loaded with
torch.load(weights_only=True, mmap=True) (mmap only where torch has it, 2.1+; gzip
through BytesIO as SpecForge does) and each tensor is compared with the reference byte
for byte. With --specforge, SpecForge's list_feature_files, OfflineManifestReader
(validate_files=True), load_feature_file, its EAGLE-3 normalizer and (--collate N) its
collator run on OUT_DIR too; modules that SpecForge imports and this machine lacks
(datasets, specforge.distributed) are stubbed, and said so. Prints one JSON summary;
exit 1 on any mismatch. Tests run it on Debian's torch 1.13; the lead runs it on the
device's torch 2.11.
"""

import argparse
import gzip
import inspect
import io
import json
import os
import re
import struct
import sys
import time
import types
import zipfile

# torch is imported after the arguments are parsed, so --help and a usage error need none.
torch = None
HAS_MMAP = False
NAMES = {"hidden_states": "hidden_state", "aux_hidden_states": "aux_hidden_state"}
notes = []


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    md = hdr.pop("__metadata__", {})
    out = {}
    for name, t in hdr.items():
        b, e = t["data_offsets"]
        out[name] = (t["dtype"], t["shape"], data[b:e])
    return md, out


def raw_bytes(t):
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.numpy().tobytes()


def metadata(path):
    data = gzip.open(path, "rb").read() if path.endswith(".gz") else open(path, "rb").read()
    z = zipfile.ZipFile(io.BytesIO(data))
    for name in z.namelist():
        if name.endswith("/extract.json"):
            return json.loads(z.read(name))
    return None


def load(path):
    if path.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            return torch.load(io.BytesIO(f.read()), weights_only=True)
    if HAS_MMAP:
        return torch.load(path, weights_only=True, mmap=True)
    return torch.load(path, weights_only=True)


def ref_path(ref_dir, sample):
    g = sample // 2000 * 2000
    return os.path.join(ref_dir, f"rows_{g}-{g + 2000}", f"data_{sample}.safetensors")


def sample_of(path):
    """The sample a file holds: its extract.json says; a file extract import linked in
    as SpecForge or Model-Optimizer wrote it has none, and its name (data_<i>.ckpt[.gz],
    <i>.pt) says."""
    md = metadata(path)
    if md is not None:
        return int(md["sample"])
    m = re.fullmatch(r"(?:data_)?(\d+)\.(?:ckpt(?:\.gz)?|pt)", os.path.basename(path))
    return int(m.group(1)) if m else None


def compare(path, d, ref_dir, problems):
    sample = sample_of(path)
    if sample is None:
        problems.append(f"{path}: no extract.json, and the name says no sample")
        return
    _, ref = read_safetensors(ref_path(ref_dir, sample))
    keys = {NAMES.get(k, k) for k in d}
    if keys != set(ref):
        problems.append(f"{path}: keys {sorted(d)}, reference {sorted(ref)}")
        return
    for k, t in d.items():
        dtype, shape, want = ref[NAMES.get(k, k)]
        got = t
        if got.dim() == len(shape) + 1 and got.shape[0] == 1:
            got = got.squeeze(0)
        if list(got.shape) != list(shape):
            problems.append(f"{path}: {k} shape {list(t.shape)}, reference {shape}")
        elif {"BF16": torch.bfloat16, "I64": torch.int64}[dtype] != got.dtype:
            problems.append(f"{path}: {k} dtype {got.dtype}, reference {dtype}")
        elif raw_bytes(got) != want:
            problems.append(f"{path}: {k} bytes differ from the reference")


def stub_missing():
    """Stub what SpecForge's collator module imports and this machine lacks."""
    try:
        import datasets  # noqa: F401
    except ImportError:
        m = types.ModuleType("datasets")
        m.Dataset = object
        sys.modules["datasets"] = m
        notes.append("stubbed module datasets (not installed)")
    try:
        import specforge.distributed  # noqa: F401
    except ImportError:
        m = types.ModuleType("specforge.distributed")
        m.get_draft_sp_group = m.get_sp_ulysses_group = m.get_sp_ring_group = lambda: None
        sys.modules["specforge.distributed"] = m
        notes.append("stubbed module specforge.distributed (absent from the reference copy)")


def run_specforge(src, out_dir, ref_dir, collate, problems, summary):
    sys.path.insert(0, src)
    if not HAS_MMAP:
        real = torch.load

        def load_without_mmap(*a, mmap=None, **kw):
            return real(*a, **kw)

        torch.load = load_without_mmap
        notes.append(f"torch {torch.__version__} has no torch.load(mmap=): SpecForge's load runs without it")
    from specforge.runtime.data_plane.feature_store import load_feature_file
    from specforge.runtime.data_plane.offline_reader import OfflineManifestReader, list_feature_files
    # eagle3/__init__.py pulls in the algorithm registry; the normalizer's own module
    # needs only torch, so it is loaded by path.
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "specforge_eagle3_data", os.path.join(src, "specforge/algorithms/eagle3/data.py")
    )
    eagle3 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(eagle3)
    normalize_offline_sample = eagle3.normalize_offline_sample

    files = list_feature_files(out_dir)
    summary["specforge_files"] = len(files)
    refs = OfflineManifestReader(out_dir, validate_files=True).read()
    summary["specforge_refs"] = len(refs)
    if len(refs) != len(files):
        problems.append(f"OfflineManifestReader made {len(refs)} refs of {len(files)} files")
    t0 = time.time()
    normalized = []
    for path in files:
        raw = load_feature_file(path)
        compare(path, raw, ref_dir, problems)
        if len(normalized) < collate:
            normalized.append(normalize_offline_sample(raw, max_len=2048))
    summary["specforge_load_s"] = round(time.time() - t0, 3)
    if collate and normalized:
        stub_missing()
        from specforge.data.utils import DataCollatorWithPadding

        batch = DataCollatorWithPadding()(normalized)
        summary["collated"] = {k: list(v.shape) for k, v in batch.items() if hasattr(v, "shape")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--reference", required=True)
    ap.add_argument("--specforge")
    ap.add_argument("--collate", type=int, default=0)
    a = ap.parse_args()
    global torch, HAS_MMAP
    import torch

    HAS_MMAP = "mmap" in inspect.signature(torch.load).parameters
    files = []
    for r, ds, ns in os.walk(a.out_dir):
        # The draft vocabulary (vocab_mapping/*.pt, as SpecForge keeps it) is no sample;
        # scripts/check_vocab_mapping.py checks it.
        ds[:] = [d for d in ds if d != "vocab_mapping"]
        files += [os.path.join(r, n) for n in ns if n.endswith((".ckpt", ".ckpt.gz", ".pt")) and not n.startswith(".")]
    files.sort()
    problems = []
    summary = {"torch": torch.__version__, "mmap": HAS_MMAP, "files": len(files)}
    t0 = time.time()
    nbytes = 0
    for path in files:
        try:
            d = load(path)
        except Exception as e:  # noqa: BLE001: every failure is a finding
            problems.append(f"{path}: torch.load(weights_only=True): {e}")
            continue
        nbytes += os.path.getsize(path)
        compare(path, d, a.reference, problems)
    dt = time.time() - t0
    summary["load_s"] = round(dt, 3)
    summary["load_MBps"] = round(nbytes / 1e6 / dt, 1) if dt > 0 else None
    if a.specforge:
        try:
            run_specforge(a.specforge, a.out_dir, a.reference, a.collate, problems, summary)
        except Exception as e:  # noqa: BLE001
            problems.append(f"specforge: {type(e).__name__}: {e}")
    summary["notes"] = notes
    summary["problems"] = problems[:50]
    summary["ok"] = not problems
    print(json.dumps(summary, indent=1))
    sys.exit(0 if not problems else 1)


if __name__ == "__main__":
    main()
