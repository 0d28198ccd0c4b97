"""The dump hook driven through SGLang's real model code, at every commit in
../shared/sglang-src, for DeepSeek-V3 and Kimi-K2.5 (real_sglang_driver.py does the
driving). Each case sends one extend batch of several requests, one of them SGLang's own
(a rid that is not ours), and checks every dump byte for byte against the rows the same
model produces. Skipped, with the reason, where ../shared or torch is missing; a
failure instead where EXTRACT_CI_REQUIRE names the missing kind (sglang-src, torch), and
always when ../shared is there but lists no commit. sglang/hook_test.go counts the cases
that ran.
"""

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

HOOK_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HOOK_DIR))


def sglang_src():
    for d in (os.environ.get("EXTRACT_SGLANG_SRC", ""), os.path.join(REPO, "shared", "sglang-src"), os.path.join(REPO, "..", "shared", "sglang-src")):
        if d and os.path.isfile(os.path.join(d, "COMMITS")):
            return os.path.abspath(d)
    return None


def torch_python():
    """An interpreter that has torch: this one, or Debian's (apt-get install python3-torch)."""
    for exe in (os.environ.get("EXTRACT_TORCH_PYTHON", ""), sys.executable, "/usr/bin/python3"):
        if exe and os.path.exists(exe) and subprocess.run([exe, "-c", "import torch"], capture_output=True).returncode == 0:
            return exe
    return None


SRC = sglang_src()
PYTHON = torch_python() if SRC else None
VERSIONS = []
if SRC:
    with open(os.path.join(SRC, "COMMITS")) as _f:
        VERSIONS = [line.split()[0] for line in _f if line.strip()]

REQUESTS = [
    {"rid": "s000000007-a1", "ids": [5, 17, 2, 9, 30, 1, 0]},
    # SGLang's own warm-up/health requests share batches with ours: no dump, and the
    # rows after them must still land in the right files.
    {"rid": "HEALTH_CHECK_1767225600.0", "ids": [0]},
    {"rid": "s000000008-a3", "ids": [31, 4, 4]},
    {"rid": "s000000009-a1", "ids": [12, 3, 8, 8, 21]},
]


def read_dump(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


# The kinds CI requires (EXTRACT_CI_REQUIRE, see internal/testsupport): a missing one
# is a failure there, not a skip.
REQUIRED = {k.strip() for k in os.environ.get("EXTRACT_CI_REQUIRE", "").split(",") if k.strip()}


def missing():
    """Why the cases cannot run here, and the kind that names it; (None, None) if they can."""
    if SRC is None:
        return "../shared/sglang-src is absent", "sglang-src"
    if PYTHON is None:
        return "no Python with torch (apt-get install -y python3-torch)", "torch"
    if not VERSIONS:
        # ../shared is there but lists no commit: zero cases would pass without a word.
        return f"{SRC}/COMMITS lists no SGLang commit", "always"
    return None, None


WHY, KIND = missing()


class RealSGLangPreconditions(unittest.TestCase):
    """Says, as a failure, that required real-SGLang cases cannot run."""

    @unittest.skipUnless(WHY and (KIND == "always" or KIND in REQUIRED), "the real-SGLang cases can run, or are not required here")
    def test_the_real_sglang_cases_can_run(self):
        self.fail(f"real-SGLang hook tests cannot run: {WHY}")


@unittest.skipIf(WHY is not None, f"real-SGLang hook tests skipped: {WHY}")
class RealSGLangTest(unittest.TestCase):
    def drive(self, version, model):
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        dump_dir, expect_dir = os.path.join(tmp, "shm"), os.path.join(tmp, "expect")
        os.mkdir(dump_dir)
        os.mkdir(expect_dir)
        spec = {
            "dir": dump_dir, "expect_dir": expect_dir, "layers": "2,30,58", "hidden": 16, "vocab": 40,
            "num_layers": 61, "seed": 7, "model": model, "model_path": "/models/" + model,
            "requests": REQUESTS, "device": os.environ.get("EXTRACT_TEST_DEVICE", "cpu"),
        }
        with open(os.path.join(tmp, "spec.json"), "w") as f:
            json.dump(spec, f)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_HS_") and k != "PYTHONPATH"}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        proc = subprocess.run(
            [PYTHON, os.path.join(HOOK_DIR, "real_sglang_driver.py"), os.path.join(SRC, version, "python"), os.path.join(tmp, "spec.json")],
            capture_output=True, text=True, env=env, timeout=300,
        )
        self.assertEqual(proc.returncode, 0, proc.stderr[-6000:])
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        self.assertNotIn("error", out)
        return out, dump_dir, expect_dir

    def check(self, version, model):
        out, dump_dir, expect_dir = self.drive(version, model)
        self.assertEqual(out["effective_layers"], [2, 30, 58], "set_eagle3_layers_to_capture of this commit")
        # Kimi's language model runs on input_embeds: the logits processor gets no ids.
        self.assertEqual(out["logits_input_ids_none"], [model == "kimi"])
        ours = [r["rid"] for r in REQUESTS if r["rid"].startswith("s")]
        self.assertEqual(sorted(os.listdir(dump_dir)), sorted(rid + ".safetensors" for rid in ours), "one dump per request of ours, no partials")
        for rid in ours:
            header, data = read_dump(os.path.join(dump_dir, rid + ".safetensors"))
            meta = header["__metadata__"]
            self.assertEqual((meta["rid"], meta["layers"], meta["protocol"], meta["model"]), (rid, "2,30,58", "1", "/models/" + model))
            with open(os.path.join(expect_dir, rid + ".bin"), "rb") as f:
                want = f.read()
            self.assertEqual(len(data), len(want), rid)
            self.assertTrue(data == want, f"{rid}: dump bytes differ from the model's rows")


def _add_cases():
    for version in VERSIONS:
        for model in ("kimi", "deepseek"):
            name = f"test_{model}_at_{version.replace('-', '_').replace('.', '_')}_dumps_each_request_once_byte_for_byte"
            setattr(RealSGLangTest, name, lambda self, v=version, m=model: self.check(v, m) and None)


_add_cases()

if __name__ == "__main__":
    unittest.main()
