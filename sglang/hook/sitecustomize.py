"""Arms extract's dump hook in every Python process that has this folder on PYTHONPATH.

Python imports sitecustomize at startup, so SGLang's spawned scheduler processes (one
per TP rank) run this too: they inherit PYTHONPATH and the SGLANG_HS_* variables.
Without SGLANG_HS_DIR it does nothing. With it, it only installs an import hook; SGLang
is patched as its modules load, and the checks run when a scheduler builds its model
(see README.md). Errors here would be printed and ignored by Python's site module, so
nothing is checked at this point.
"""

import os

if os.environ.get("SGLANG_HS_DIR"):
    from extract_hook import seams

    seams.install()
