"""How long the forward thread blocks in the dump hook per extend batch, on a GPU.

    python bench_capture.py [--old OLD_HOOK_DIR] [--tokens 16384] [--hidden 7168]

Each round queues a stand-in forward on the current stream (matmuls that produce the
final and three aux hidden states, as a prefill's tail would), then calls
capture.write_batch as the patched LogitsProcessor does and times that call on the
CPU: the time the scheduler's forward thread cannot go on. The writes then finish
(not timed). With --old, the same for the hook in OLD_HOOK_DIR first (the hook before
the side stream). Prints one JSON line per hook.
"""

import argparse
import importlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time


def bench(hook_dir, tokens, hidden, rounds, requests):
    for name in [m for m in sys.modules if m == "extract_hook" or m.startswith("extract_hook.")]:
        del sys.modules[name]
    sys.path.insert(0, hook_dir)
    try:
        capture = importlib.import_module("extract_hook.capture")
    finally:
        sys.path.remove(hook_dir)
    import torch

    dev = torch.device("cuda")
    per = tokens // requests
    reqs = [(f"s{i:09d}-a1", per) for i in range(requests)]
    fb = type("FB", (), {})()
    fb.extend_seq_lens_cpu, fb.extend_prefix_lens_cpu = [per] * requests, [0] * requests
    need = 3 * tokens * hidden * 2 * 4
    space = "/dev/shm" if shutil.disk_usage("/dev/shm").free > need else None
    out_dir = tempfile.mkdtemp(dir=space)
    w = torch.randn(hidden, hidden, device=dev, dtype=torch.bfloat16) / hidden**0.5
    x = torch.randn(tokens, hidden, device=dev, dtype=torch.bfloat16)
    ids = torch.randint(0, 163840, (tokens,), device=dev)
    times, forward_ms = [], []
    for r in range(rounds + 1):
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        # A stand-in forward: enough queued GPU work to be a prefill's tail.
        h = x
        aux = []
        for i in range(12):
            h = torch.tanh(h @ w)
            if i in (2, 6, 10):
                aux.append(h)
        end.record()
        t0 = time.perf_counter()
        capture.write_batch(out_dir, (2, 30, 58), "bench", reqs, fb, ids, h, aux)
        blocked = time.perf_counter() - t0
        capture.flush()
        torch.cuda.synchronize()
        if r:  # the first round warms the allocators
            times.append(blocked * 1e3)
            forward_ms.append(start.elapsed_time(end))
        for n in os.listdir(out_dir):
            os.unlink(os.path.join(out_dir, n))
    shutil.rmtree(out_dir)
    return {
        "hook": hook_dir,
        "tokens": tokens,
        "hidden": hidden,
        "bytes_per_batch": tokens * hidden * 2 * 4 + tokens * 8,
        "staging": space or tempfile.gettempdir(),
        "blocked_ms_median": round(statistics.median(times), 3),
        "blocked_ms_all": [round(t, 3) for t in times],
        "stand_in_forward_gpu_ms_median": round(statistics.median(forward_ms), 3),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--old")
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=8)
    a = p.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    for hook_dir in ([a.old] if a.old else []) + [here]:
        print(json.dumps(bench(os.path.abspath(hook_dir), a.tokens, a.hidden, a.rounds, a.requests)), flush=True)


if __name__ == "__main__":
    main()
