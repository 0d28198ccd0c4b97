"""Tests of the import hook and the activation against a stub of SGLang's seams.

Each case starts a fresh interpreter with this folder and a stub `sglang` package on
PYTHONPATH, as SGLang's scheduler processes start, so sitecustomize and the meta-path
finder run for real. The stub has only the names the hook relies on (see seams.py).
The last case pushes real torch tensors through the patched LogitsProcessor and reads
the dumps back with the safetensors library; it is skipped where torch is missing.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

HOOK_DIR = os.path.dirname(os.path.abspath(__file__))

STUB = {
    "sglang/__init__.py": '__version__ = "0.0.0+stub"\n',
    "sglang/srt/__init__.py": "",
    "sglang/srt/layers/__init__.py": "",
    "sglang/srt/managers/__init__.py": "",
    "sglang/srt/model_executor/__init__.py": "",
    "sglang/srt/server_args.py": """
        import dataclasses

        @dataclasses.dataclass
        class ServerArgs:
            model_path: str = ""

            def __post_init__(self):
                pass
    """,
    "sglang/srt/layers/logits_processor.py": """
        class LogitsProcessor:
            def forward(self, input_ids, hidden_states, lm_head, logits_metadata, {aux}):
                return "logits"
    """,
    "sglang/srt/managers/schedule_batch.py": """
        import dataclasses

        class Req:
            def __init__(self, rid, origin_input_ids):
                self.rid = rid
                self.origin_input_ids = origin_input_ids

        @dataclasses.dataclass
        class ModelWorkerBatch:
            forward_mode: object
            extend_seq_lens: list
            extend_prefix_lens: list
            reqs: list = None
    """,
    "sglang/srt/model_executor/forward_batch_info.py": """
        import dataclasses

        class ForwardMode:
            def __init__(self, extend):
                self.extend = extend

            def is_extend(self):
                return self.extend

        @dataclasses.dataclass
        class ForwardBatch:
            forward_mode: object
            input_ids: object = None
            extend_seq_lens_cpu: list = None
            extend_prefix_lens_cpu: list = None

            @classmethod
            def init_new(cls, batch, model_runner):
                return cls(batch.forward_mode, None, batch.extend_seq_lens, batch.extend_prefix_lens)
    """,
    "sglang/srt/model_executor/model_runner.py": """
        from sglang.srt.layers.logits_processor import LogitsProcessor
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch

        LOADED = []

        class Config:
            num_hidden_layers = 61

        class Layers:
            layers_to_capture = []

        class DeepseekLike:
            def __init__(self):
                self.config = Config()
                self.model = Layers()

            def set_eagle3_layers_to_capture(self, layer_ids=None):
                self.model.layers_to_capture = [i + 1 for i in layer_ids]

        class KimiLike:
            def __init__(self):
                self.language_model = DeepseekLike()

        class ModelRunner:
            def __init__(self, model_config, gpu_id, tp_rank, tp_size, server_args):
                LOADED.append(tp_rank)
                self.model = KimiLike()
    """,
}

# Builds a ModelRunner as a scheduler would, then drives the patched seams; prints JSON.
DRIVER = """
import json, logging, os, sys, types
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
spec = json.loads(sys.argv[1])
from sglang.srt.model_executor import model_runner
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.managers.schedule_batch import ModelWorkerBatch, Req
from sglang.srt.layers.logits_processor import LogitsProcessor

out = {}
args = types.SimpleNamespace(**spec["server_args"])
try:
    runner = model_runner.ModelRunner(None, 0, spec["tp_rank"], 8, args)
except RuntimeError as err:
    out["error"] = str(err)
out["loaded"] = model_runner.LOADED
out["fusion"] = args.enable_flashinfer_allreduce_fusion
if "error" not in out:
    out["layers_to_capture"] = runner.model.language_model.model.layers_to_capture

    def batch(extend, rids_and_lens):
        reqs = [Req(rid, list(range(n))) for rid, n in rids_and_lens]
        lens = [n for _, n in rids_and_lens]
        return ForwardBatch.init_new(ModelWorkerBatch(ForwardMode(extend), lens, [0] * len(lens), reqs), runner)

    decode = batch(False, [("s000000001-a1", 1)])
    out["decode_reqs"] = getattr(decode, "_extract_hs_reqs", None)
    out["decode_out"] = LogitsProcessor().forward(None, None, None, decode, None)
    extend = batch(True, [("HEALTH_CHECK_1", 3)])
    out["extend_reqs"] = getattr(extend, "_extract_hs_reqs", None)
    rows = types.SimpleNamespace(shape=(3, 16))
    out["extend_out"] = LogitsProcessor().forward(None, rows, None, extend, [])

    if spec.get("torch"):
        import torch
        from safetensors import safe_open

        from extract_hook import capture

        dev = "cuda" if torch.cuda.is_available() else "cpu"
        g = torch.Generator().manual_seed(0)
        H, reqs = 16, [("HEALTH_CHECK_2", 4), ("s000000007-a1", 5), ("s000000008-a3", 3)]
        n = sum(k for _, k in reqs)
        ids = torch.randint(0, 163840, (n,), generator=g)
        hidden = torch.randn(n, H, generator=g).to(torch.bfloat16)
        aux = [torch.randn(n, H, generator=g).to(torch.bfloat16) for _ in range(3)]
        fb = batch(True, reqs)
        checks = {}
        # As SGLang hands them over: a list of bf16 layers, then one packed tensor
        # (newer SGLang packs); the packed run also gets int32 ids to convert.
        for name, aux_arg, ids_arg in (
            ("list", [a.to(dev) for a in aux], ids.to(dev)),
            ("packed", torch.cat(aux, dim=1).to(dev), ids.to(torch.int32).to(dev)),
        ):
            # The hook reads the flat ids from the ForwardBatch (None at the logits
            # processor for Kimi-K2.5).
            fb.input_ids = ids_arg
            LogitsProcessor().forward(None, hidden.to(dev), None, fb, aux_arg)
            capture.flush()
            got = {}
            start = 4
            for rid, k in reqs[1:]:
                path = os.path.join(os.environ["SGLANG_HS_DIR"], rid + ".safetensors")
                with safe_open(path, "pt") as f:
                    t = {key: f.get_tensor(key) for key in f.keys()}
                    meta = f.metadata()
                rows = slice(start, start + k)
                got[rid] = {
                    "aux": torch.equal(t["aux_hidden_state"], torch.cat([a[rows] for a in aux], dim=1)),
                    "hidden": torch.equal(t["hidden_state"], hidden[rows]),
                    "ids": torch.equal(t["input_ids"], ids[rows]),
                    "dtypes": [str(t[key].dtype) for key in ("aux_hidden_state", "hidden_state", "input_ids")],
                    "meta": meta,
                }
                start += k
            checks[name] = got
        out["torch"] = {"device": dev, "checks": checks, "files": sorted(os.listdir(os.environ["SGLANG_HS_DIR"]))}
print(json.dumps(out))
"""

GOOD_ARGS = {
    "disable_radix_cache": True,
    "chunked_prefill_size": -1,
    "enable_two_batch_overlap": False,
    "enable_flashinfer_allreduce_fusion": True,
    "model_path": "/models/Kimi-K2.5",
    "tp_size": 8,
}


def have(module):
    return importlib.util.find_spec(module) is not None


class SeamsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="hook-seams-")
        self.addCleanup(shutil.rmtree, self.tmp)
        self.stub = os.path.join(self.tmp, "stub")
        self.shm = os.path.join(self.tmp, "shm")
        os.mkdir(self.shm)

    def write_stub(self, aux="aux_hidden_states=None"):
        for path, text in STUB.items():
            full = os.path.join(self.stub, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "w") as f:
                f.write(textwrap.dedent(text).replace("{aux}", aux))

    def run_python(self, args, env_extra):
        env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_HS_")}
        env.update(PYTHONPATH=os.pathsep.join([HOOK_DIR, self.stub]), PYTHONDONTWRITEBYTECODE="1")
        env.update(env_extra)
        return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=120)

    def drive(self, tp_rank=0, layers="2,30,58", server_args=None, torch=False):
        spec = {"tp_rank": tp_rank, "server_args": dict(GOOD_ARGS, **(server_args or {})), "torch": torch}
        proc = self.run_python(
            ["-c", DRIVER, json.dumps(spec)],
            {"SGLANG_HS_DIR": self.shm, "SGLANG_HS_LAYERS": layers},
        )
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return json.loads(proc.stdout), proc.stderr

    def marker(self):
        names = [n for n in os.listdir(self.shm) if n.startswith(".hook-")]
        self.assertLessEqual(len(names), 1, names)
        if not names:
            return None
        with open(os.path.join(self.shm, names[0])) as f:
            return json.load(f)

    def test_without_the_env_nothing_is_installed(self):
        self.write_stub()
        proc = self.run_python(
            ["-c", "import sys; print(any('extract_hook' in type(f).__module__ for f in sys.meta_path), 'extract_hook' in sys.modules)"],
            {},
        )
        self.assertEqual(proc.stdout.split(), ["False", "False"], proc.stderr)

    def test_activation_on_rank_zero(self):
        self.write_stub()
        out, log = self.drive()
        self.assertNotIn("error", out)
        self.assertEqual(out["layers_to_capture"], [2, 30, 58])
        self.assertFalse(out["fusion"], "all-reduce fusion must be forced off")
        self.assertIn("FlashInfer all-reduce fusion", log)
        marker = self.marker()
        self.assertEqual(marker["layers"], "2,30,58")
        self.assertEqual(marker["sglang_version"], "0.0.0+stub")
        self.assertEqual(marker["model"], "/models/Kimi-K2.5")
        self.assertEqual(marker["protocol"], "1")
        self.assertEqual(marker["tp_size"], 8)
        self.assertIn("hook_version", marker)
        # Decode batches carry nothing and pass straight through.
        self.assertIsNone(out["decode_reqs"])
        self.assertEqual(out["decode_out"], "logits")
        # EXTEND batches carry their requests; SGLang's own requests are not dumped.
        self.assertEqual(out["extend_reqs"], [["HEALTH_CHECK_1", 3]])
        self.assertEqual(out["extend_out"], "logits")
        self.assertIn("rid HEALTH_CHECK_1 not dumped: not a protocol v1 rid", log)

    def test_other_ranks_capture_but_do_not_write(self):
        self.write_stub()
        out, _ = self.drive(tp_rank=3)
        self.assertEqual(out["layers_to_capture"], [2, 30, 58])
        self.assertFalse(out["fusion"])
        self.assertIsNone(self.marker())
        self.assertIsNone(out["extend_reqs"])

    def test_bad_server_args_fail_before_the_model_loads(self):
        self.write_stub()
        out, log = self.drive(
            server_args={"disable_radix_cache": False, "chunked_prefill_size": 8192, "enable_two_batch_overlap": True}
        )
        self.assertEqual(out["loaded"], [])
        for want in ("--disable-radix-cache", "--chunked-prefill-size -1", "two-batch overlap"):
            self.assertIn(want, out["error"])
        self.assertIn("ERROR extract-hook: FATAL: the dump hook cannot capture", log)
        self.assertIsNone(self.marker())

    def test_a_missing_seam_fails_at_activation(self):
        self.write_stub(aux="*args")
        out, log = self.drive()
        self.assertEqual(out["loaded"], [])
        self.assertIn("LogitsProcessor.forward has no parameter aux_hidden_states", out["error"])
        self.assertIn("cannot patch sglang.srt.layers.logits_processor", log)
        self.assertIsNone(self.marker())

    def test_bad_layers(self):
        self.write_stub()
        out, _ = self.drive(layers="1,29")
        self.assertIn("SGLANG_HS_LAYERS", out["error"])
        self.assertEqual(out["loaded"], [])
        out, _ = self.drive(layers="2,30,61")
        self.assertIn("the model has 61 layers", out["error"])
        self.assertIsNone(self.marker())

    @unittest.skipUnless(have("torch") and have("safetensors"), "needs torch and safetensors")
    def test_dumps_hold_the_tensors(self):
        self.write_stub()
        out, log = self.drive(torch=True)
        self.assertNotIn("error", out)
        result = out["torch"]
        files = [n for n in result["files"] if not n.startswith(".hook-")]
        self.assertEqual(files, ["s000000007-a1.safetensors", "s000000008-a3.safetensors"], log)
        for run, per_rid in result["checks"].items():
            for rid, check in per_rid.items():
                with self.subTest(run=run, rid=rid, device=result["device"]):
                    self.assertTrue(check["aux"] and check["hidden"] and check["ids"], check)
                    self.assertEqual(check["dtypes"], ["torch.bfloat16", "torch.bfloat16", "torch.int64"])
                    self.assertEqual(check["meta"]["rid"], rid)
                    self.assertEqual(check["meta"]["layers"], "2,30,58")


if __name__ == "__main__":
    unittest.main()
