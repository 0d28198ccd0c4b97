"""What FlashInfer all-reduce fusion does to the captured layers at each SGLang commit in
../shared/sglang-src, read from the real server_args.py and deepseek_v2.py: why the
hook turns `enable_flashinfer_allreduce_fusion` off, and why from v0.5.15 on it leaves
`flashinfer_allreduce_fusion_backend` alone.

- Before v0.5.15 the flag is the switch, and SGLang turns it on by itself for
  DeepSeek-V3 and Kimi-K2.5; the model captures `hidden_states + residual` in its layer
  loop, before the next layer's (fused) all-reduce: one rank's partial sum. Off it must be.
- From v0.5.15 on the flag is a deprecated alias that __post_init__ maps to
  `flashinfer_allreduce_fusion_backend` and then resets to False, so the hook's override
  changes nothing; but the capture moved into the layer communicator
  (`prepare_attn_and_capture_last_layer_outputs`), which takes the residual after
  `prepare_attn`, where the fused all-reduce + residual add + RMSNorm has run: the sum of
  every rank. Fusion on or off, the rows are the same, so the backend may stay as is.

Skipped with the reason where ../shared is absent; a failure instead where
EXTRACT_CI_REQUIRE names sglang-src.
"""

import ast
import os
import re
import unittest

HOOK_DIR = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HOOK_DIR))
REQUIRED = {k.strip() for k in os.environ.get("EXTRACT_CI_REQUIRE", "").split(",") if k.strip()}


def sglang_src():
    for d in (os.environ.get("EXTRACT_SGLANG_SRC", ""), os.path.join(REPO, "shared", "sglang-src"), os.path.join(REPO, "..", "shared", "sglang-src")):
        if d and os.path.isfile(os.path.join(d, "COMMITS")):
            return os.path.abspath(d)
    return None


SRC = sglang_src()
VERSIONS = []
if SRC:
    with open(os.path.join(SRC, "COMMITS")) as _f:
        VERSIONS = [line.split()[0] for line in _f if line.strip()]


def read(version, rel):
    with open(os.path.join(SRC, version, "python", "sglang", "srt", rel)) as f:
        return f.read()


def server_args_fields(text):
    """The fields of the ServerArgs dataclass."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef) and node.name == "ServerArgs":
            return {n.target.id for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    raise AssertionError("no class ServerArgs")


def capture_site(model_text):
    """Where DeepseekV2Model captures a layer's input for EAGLE-3."""
    if re.search(r"aux_hidden_states\.append\(\s*hidden_states \+ residual\s*\)", model_text):
        return "in the layer loop, before the next layer's all-reduce"
    if "captured_last_layer_outputs=" in model_text and "prepare_attn_and_capture_last_layer_outputs" in model_text:
        return "in the communicator, after prepare_attn's all-reduce"
    return "unknown"


def hook_overrides():
    """The ServerArgs attributes the hook's fusion override assigns."""
    with open(os.path.join(HOOK_DIR, "extract_hook", "seams.py")) as f:
        text = f.read()
    return set(re.findall(r"server_args\.(\w*allreduce_fusion\w*) = ", text))


@unittest.skipUnless(SRC is None and "sglang-src" in REQUIRED, "../shared/sglang-src is present, or not required here")
class FusionSourcesRequired(unittest.TestCase):
    def test_the_sglang_sources_are_here(self):
        self.fail("sglang-src is required (EXTRACT_CI_REQUIRE) but ../shared/sglang-src is absent")


@unittest.skipIf(SRC is None, "../shared/sglang-src is absent: the fusion checks against real SGLang are skipped")
class FusionAcrossVersions(unittest.TestCase):
    def test_the_hook_overrides_the_old_flag_only(self):
        self.assertEqual(hook_overrides(), {"enable_flashinfer_allreduce_fusion"})

    def test_fusion_off_is_needed_exactly_where_the_old_flag_is_the_switch(self):
        self.assertTrue(VERSIONS, "COMMITS lists no commit")
        for version in VERSIONS:
            with self.subTest(version=version):
                args = read(version, "server_args.py")
                fields = server_args_fields(args)
                site = capture_site(read(version, "models/deepseek_v2.py"))
                self.assertIn("enable_flashinfer_allreduce_fusion", fields)
                if "flashinfer_allreduce_fusion_backend" in fields:
                    # The old flag is reset after it is mapped to the backend: the
                    # hook's override is a no-op here, and needs not be more.
                    self.assertIn("self.enable_flashinfer_allreduce_fusion = False", args)
                    self.assertEqual(site, "in the communicator, after prepare_attn's all-reduce",
                                     f"{version}: with the backend switch, a capture before the fused all-reduce would need the backend off")
                else:
                    self.assertEqual(site, "in the layer loop, before the next layer's all-reduce", version)


if __name__ == "__main__":
    unittest.main()
