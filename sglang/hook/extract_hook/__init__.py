"""extract's dump hook for SGLang: protocol v1 hidden-state dumps, one file per request.

sitecustomize.py (next to this package) arms the hook when SGLANG_HS_DIR is set; see
README.md for the seams it patches. writer.py and the planning half of capture.py are
pure Python; capture.write_batch imports torch when it runs, so every module here
imports without torch.
"""

HOOK_VERSION = "1.0.0"
PROTOCOL = "1"
