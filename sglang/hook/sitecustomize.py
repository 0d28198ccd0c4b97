"""Arms extract's dump hook in every Python process that has this folder on PYTHONPATH.

Python imports sitecustomize at startup, so SGLang's spawned scheduler processes (one
per TP rank) run this too: they inherit PYTHONPATH and the SGLANG_HS_* variables.
Without SGLANG_HS_DIR it does nothing. With it, it only installs an import hook; SGLang
is patched as its modules load, and the checks run when a scheduler builds its model
(see README.md). Errors here would be printed and ignored by Python's site module, so
nothing is checked at this point.

This folder goes first on PYTHONPATH, so Python finds this file and would never import
the sitecustomize the environment already has (Debian's, a conda env's, a site's CUDA
or proxy setup): the next one on sys.path is run after ours, as if ours were not there.
"""

import os


def _chain():
    import importlib.machinery
    import importlib.util
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


try:
    if os.environ.get("SGLANG_HS_DIR"):
        from extract_hook import seams

        seams.install()
finally:
    _chain()
