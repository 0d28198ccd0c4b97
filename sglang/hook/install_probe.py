"""extract doctor's probe of the SGLang install (sglang.InspectInstall runs it with -c).

One process, no model load: it arms the dump hook (its folder is on PYTHONPATH), imports
sglang, asks the hook which seams the installed SGLang supports, and says where the
package and its pip metadata are. The Go side audits the files (RECORD hashes or git).
Everything goes out as one JSON line after PREFIX, so whatever SGLang or torch print
on import cannot be mistaken for the answer. This file is not part of the hook the
server runs.
"""

import importlib.metadata
import importlib.util
import json
import os
import sys

PREFIX = "extract-install-probe: "
out = {}


def emit():
    sys.stdout.write("\n" + PREFIX + json.dumps(out) + "\n")
    sys.stdout.flush()


def describe(err):
    return f"{type(err).__name__}: {err}"


try:
    # Before sglang: the hook patches the seam modules as they are imported, and
    # sglang's own __init__ may import some of them.
    from extract_hook import seams

    seams.install()
except Exception as err:  # the seams are then unknown, the rest still useful
    seams = None
    out["hook_error"] = describe(err)

spec = importlib.util.find_spec("sglang")
if spec is None or spec.origin is None:  # a bare folder named sglang is a namespace package
    out["missing"] = True
    emit()
    sys.exit(0)

try:
    import sglang

    out["location"] = os.path.dirname(os.path.realpath(sglang.__file__))
    out["version"] = str(getattr(sglang, "__version__", "") or (seams.sglang_version() if seams else ""))
except Exception as err:
    out["location"] = os.path.dirname(os.path.realpath(spec.origin))
    out["import_error"] = describe(err)

try:
    dist = importlib.metadata.distribution("sglang")
    out["dist_info"] = str(getattr(dist, "_path", "") or "")
    out["site"] = str(dist.locate_file(""))
    init = os.path.realpath(str(dist.locate_file("sglang/__init__.py")))
    out["dist_matches"] = init == os.path.join(out["location"], "__init__.py")
    out["record"] = dist.read_text("RECORD") is not None
    direct = dist.read_text("direct_url.json")
    if direct:
        out["direct_url"] = json.loads(direct)
    if not out.get("version"):
        out["version"] = dist.version
except importlib.metadata.PackageNotFoundError:
    pass
except Exception as err:
    out["dist_error"] = describe(err)

# Said now as well: a seam import that kills the process (a CUDA library that aborts)
# leaves the Go side with everything but the seams.
emit()

if seams is not None and "import_error" not in out:
    try:
        out["seams"] = seams.seam_report()
    except Exception as err:
        out["hook_error"] = describe(err)

emit()
