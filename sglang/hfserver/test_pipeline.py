"""extract_hook.pipeline on the CPU (no CUDA here: the copy is a plain one, the rest -
the host layout, the pooled buffers, the writer threads - is the code the GPU runs) and
the server's window planning.

Run from this folder: python3 -m unittest (needs torch for the pipeline; skips without).
"""

import os
import sys
import threading
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "hook")]

from extract_hfserver import batching  # noqa: E402
from extract_hook import pipeline  # noqa: E402

try:
    import torch
except ImportError:
    torch = None


class Req:
    def __init__(self, n, name=""):
        self.ids, self.rid = [1] * n, name


class PlanWindowTest(unittest.TestCase):
    def test_a_window_is_sorted_by_length_before_it_is_cut_into_batches(self):
        window = [Req(n, f"r{n}") for n in (30, 2, 31, 3, 29, 1)]
        batches = batching.plan_window(window, max_tokens=64, max_requests=8)
        self.assertEqual([[len(r.ids) for r in b] for b in batches], [[1, 2, 3], [29, 30], [31]])
        self.assertEqual(sorted(r.rid for b in batches for r in b), sorted(r.rid for r in window))

    def test_spans_follow_the_lengths(self):
        self.assertEqual(batching.spans([3, 1, 2]), [(0, 3), (3, 4), (4, 6)])

    def test_layout_puts_a_requests_aux_and_final_rows_in_one_slice_each(self):
        # 6 rows of H = 2: aux block 6 x 6, then final block 6 x 2.
        self.assertEqual(pipeline.layout(6, 2, 3, 4), (18, 24, 42, 44))
        self.assertEqual(pipeline.layout(6, 2, 0, 6), (0, 36, 36, 48))
        with self.assertRaises(ValueError):
            pipeline.layout(6, 2, 4, 7)


@unittest.skipIf(torch is None, "torch is not importable here (install python3-torch)")
class PipelineTest(unittest.TestCase):
    H = 2

    def make(self, **kw):
        return pipeline.Pipeline(torch, torch.device("cpu"), capacity_rows=4, hidden=self.H, **kw)

    def fill(self, p, rows, seed):
        flat, aux, fin = p.device_buffer(rows)
        aux.copy_(torch.arange(rows * 3 * self.H, dtype=torch.float32).view(rows, -1) + seed)
        fin.copy_(-torch.arange(rows * self.H, dtype=torch.float32).view(rows, -1) - seed)
        return flat

    def test_each_item_gets_its_own_rows_of_aux_and_final(self):
        p = self.make(buffers=2, writers=2)
        got, done = {}, threading.Event()

        def write(host, item, start, end, rows):
            a0, a1, f0, f1 = pipeline.layout(rows, self.H, start, end)
            got[item] = (host[a0:a1].view(end - start, 3 * self.H).float(), host[f0:f1].view(end - start, self.H).float())

        flat = self.fill(p, 3, 100)
        want_aux, want_fin = flat[:18].view(3, 6).float().clone(), flat[18:].view(3, 2).float().clone()
        p.submit(flat, 3, ["a", "b"], [(0, 2), (2, 3)], write, done.set)
        self.assertTrue(done.wait(30))
        self.assertTrue(torch.equal(got["a"][0], want_aux[0:2]) and torch.equal(got["b"][0], want_aux[2:3]))
        self.assertTrue(torch.equal(got["a"][1], want_fin[0:2]) and torch.equal(got["b"][1], want_fin[2:3]))

    def test_the_forward_waits_while_every_host_buffer_holds_unwritten_rows(self):
        p = self.make(buffers=1, writers=1)
        release, second_in = threading.Event(), threading.Event()
        p.submit(self.fill(p, 2, 0), 2, ["a"], [(0, 2)], lambda *a: release.wait(), lambda: None)

        def second():
            p.submit(self.fill(p, 2, 1), 2, ["b"], [(0, 2)], lambda *a: None, second_in.set)

        t = threading.Thread(target=second)
        t.start()
        t.join(0.3)
        self.assertTrue(t.is_alive(), "a second batch took the only host buffer while the first was being written")
        release.set()
        t.join(30)
        self.assertTrue(second_in.wait(30))

    def test_a_batch_larger_than_the_buffers_gets_one_of_its_own(self):
        p = self.make(buffers=1, writers=1)
        done = threading.Event()
        seen = []
        p.submit(self.fill(p, 9, 0), 9, ["long"], [(0, 9)], lambda host, *a: seen.append(host.numel()), done.set)
        self.assertTrue(done.wait(30))
        self.assertEqual(seen, [9 * 4 * self.H])
        # The pool's one buffer is still there for the next batch.
        done2 = threading.Event()
        p.submit(self.fill(p, 2, 0), 2, ["short"], [(0, 2)], lambda *a: None, done2.set)
        self.assertTrue(done2.wait(30))


if __name__ == "__main__":
    unittest.main()
