"""extract generate's route on the transformers server (generation.py) with a fake model
whose generate is known in closed form. Run from this folder: python3 -m unittest."""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "hook")]

try:
    import torch
except ImportError:
    torch = None


class FakeLM:
    """generate appends ids 10, 11, ... and the eos 2 after `stop_after` of them."""

    def __init__(self, stop_after):
        self.stop_after = stop_after
        self.generation_config = type("G", (), {"eos_token_id": 2})()
        self.calls = []

    def parameters(self):
        yield torch.zeros(1)

    def generate(self, input_ids, attention_mask, max_new_tokens, eos_token_id, pad_token_id, **kw):
        self.calls.append(kw)
        out = [10 + k for k in range(self.stop_after)] + [2]
        return torch.cat([input_ids, torch.tensor([out[:max_new_tokens]])], dim=1)


class FakeBackend:
    name = "fake"
    vocab_size = 100
    device = None

    def __init__(self, stop_after):
        self.model = FakeLM(stop_after)


@unittest.skipIf(torch is None, "needs torch")
class GenerationTest(unittest.TestCase):
    def sp(self, **kw):
        from extract_hfserver import generation

        body = {"rid": "g000000001-t1-a1", "input_ids": [5, 6, 7], "sampling_params": dict({"max_new_tokens": 8, "temperature": 0}, **kw)}
        rid, ids, sp, msg = generation.parse(body, 100)
        self.assertIsNone(msg)
        return ids, sp

    def test_a_reply_that_ends_with_the_eos_is_stop_with_the_eos_in_output_ids(self):
        from extract_hfserver import generation

        ids, sp = self.sp()
        b = FakeBackend(3)
        out, finish, _ = generation.generate(b, "/nonexistent", ids, sp)
        self.assertEqual(out, [10, 11, 12, 2])
        self.assertEqual(finish, {"type": "stop", "matched": 2})
        self.assertEqual(b.model.calls[0]["do_sample"], False)

    def test_a_reply_cut_at_max_new_tokens_is_length(self):
        from extract_hfserver import generation

        ids, sp = self.sp(max_new_tokens=2)
        out, finish, _ = generation.generate(FakeBackend(5), "/nonexistent", ids, sp)
        self.assertEqual(out, [10, 11])
        self.assertEqual(finish, {"type": "length", "length": 2})

    def test_sampling_keys_reach_generate_and_bad_ones_are_refused(self):
        from extract_hfserver import generation

        ids, sp = self.sp(temperature=0.7, top_p=0.9, top_k=20, sampling_seed=3)
        b = FakeBackend(1)
        generation.generate(b, "/nonexistent", ids, sp)
        self.assertEqual({k: b.model.calls[0][k] for k in ("do_sample", "temperature", "top_p", "top_k")},
                         {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "top_k": 20})
        for bad in ({"input_ids": [5, 1000]}, {"input_ids": []}, {"sampling_params": {"max_new_tokens": 0}},
                    {"sampling_params": {"top_p": 0}}):
            body = dict({"rid": "g1", "input_ids": [5], "sampling_params": {}}, **bad)
            self.assertIsNotNone(generation.parse(body, 100)[3], bad)

    def test_only_g_rids_are_generations(self):
        from extract_hfserver import generation

        self.assertTrue(generation.is_generation({"rid": "g000000001-t0-a1"}))
        self.assertFalse(generation.is_generation({"rid": "s000000001-a1"}))
        self.assertFalse(generation.is_generation([]))


if __name__ == "__main__":
    unittest.main()
