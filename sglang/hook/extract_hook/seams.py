"""The SGLang seams: an import hook that patches SGLang modules as they load, the launch
check in the server's main process, and the activation in every scheduler process.

Every seam is chosen by what the running SGLang has (feature detection, never a
version string); docs/server.md has the table of seams and the SGLang change behind
each variant. In short:

- srt/server_args.py: ServerArgs.__post_init__ runs in the launching process. We turn
  prefill CUDA graphs off before it (disable_prefill_cuda_graph since the
  cuda_graph_config rework, disable_piecewise_cuda_graph since #16331, nothing before:
  enable_piecewise_cuda_graph defaults off), then check the resolved settings and the
  other seams; a problem exits the process with code 3 before any weights load.
- srt/model_executor/model_runner.py: ModelRunner.__init__ takes tp_rank (until
  #31161) or a ParallelState ps with ps.tp_rank (after). After it returns, the model is
  loaded and we call its set_eagle3_layers_to_capture.
- srt/model_executor/forward_batch_info.py: ForwardBatch.init_new(batch, runner)
  takes a ModelWorkerBatch (until #25516) or the ScheduleBatch itself (after); both
  have .reqs, which we copy as (rid, prompt length). ForwardBatch.rids (#19372) is
  checked against them where it exists. ForwardBatch.input_ids is the flat [T] ids.
- srt/layers/logits_processor.py: LogitsProcessor.forward(input_ids, hidden_states,
  lm_head, logits_metadata, aux_hidden_states, ...) sees every row of an extend batch
  before it prunes to one row per request. Its input_ids is None for Kimi-K2.5
  (general_mm_embed_routine calls the language model with input_embeds only), so
  the ids come from the ForwardBatch.
- srt/models/kimi_k25.py: the wrapper has its own set_eagle3_layers_to_capture since
  #19689 and keeps num_hidden_layers under config.text_config.
"""

import dataclasses
import functools
import importlib
import importlib.abc
import inspect
import logging
import os
import sys

from . import capture, writer

log = logging.getLogger("extract_hook")

# The one line an operator needs: extract finds it in the server log tail by this prefix
# (sglang.HookRefusal on the Go side) and exits 3.
FATAL_PREFIX = "extract-hook: FATAL: "
# Exit status of a launch the hook refuses: extract's "preflight refused".
EXIT_REFUSED = 3

SERVER_ARGS_MODULE = "sglang.srt.server_args"
LOGITS_MODULE = "sglang.srt.layers.logits_processor"
BATCH_MODULE = "sglang.srt.model_executor.forward_batch_info"
RUNNER_MODULE = "sglang.srt.model_executor.model_runner"
SCHEDULE_MODULE = "sglang.srt.managers.schedule_batch"

# Where ForwardBatch.init_new leaves (rid, prompt length) per request for the logits
# processor, which sees the ForwardBatch but not the requests.
_REQS_ATTR = "_extract_hs_reqs"

_LOGITS_ARGS = ("hidden_states", "logits_metadata", "aux_hidden_states")
_BATCH_FIELDS = ("forward_mode", "input_ids", "extend_seq_lens_cpu", "extend_prefix_lens_cpu")


def _prefill_graphs(args):
    """Whether extend batches may replay a CUDA graph (which skips the Python capture),
    read from whichever setting this SGLang has."""
    config = getattr(args, "cuda_graph_config", None)
    prefill = getattr(config, "prefill", None)
    if prefill is None and isinstance(config, dict):
        prefill = config.get("prefill")
    backend = prefill.get("backend") if isinstance(prefill, dict) else getattr(prefill, "backend", None)
    if backend is not None:
        # cuda_graph_config (after the per-phase rework): full, breakable,
        # tc_piecewise or disabled.
        return str(getattr(backend, "value", backend)).lower() != "disabled", f"prefill CUDA graph backend {backend}"
    if hasattr(args, "disable_piecewise_cuda_graph"):
        # #16331: piecewise graphs on by default, this flag turns them off.
        return not args.disable_piecewise_cuda_graph, "piecewise CUDA graphs"
    return bool(getattr(args, "enable_piecewise_cuda_graph", False)), "piecewise CUDA graphs"


# Server settings that make the captured rows wrong or incomplete: (attribute, how
# versions without the attribute behave, test of a good value, why and what to change).
_SERVER_ARGS = (
    (
        "disable_radix_cache",
        False,
        lambda v: v is True,
        "radix cache is on: a prefix-cache hit leaves the cached prefix's rows out; "
        "launch with --disable-radix-cache",
    ),
    (
        "chunked_prefill_size",
        None,
        lambda v: v is None or v <= 0,
        "chunked prefill is on (size {value}): a long prompt would arrive in chunks; "
        "launch with --chunked-prefill-size -1",
    ),
    (
        "enable_two_batch_overlap",
        False,
        lambda v: not v,
        "two-batch overlap is on: it runs the MoE layers outside DeepseekV2Model's "
        "capture loop; launch without --enable-two-batch-overlap",
    ),
    (
        "enable_dp_attention",
        False,
        lambda v: not v,
        "DP attention is on: TP rank 0 holds only its own DP group's rows; "
        "launch without --enable-dp-attention",
    ),
    (
        "pp_size",
        1,
        lambda v: v == 1,
        "pipeline parallel size is {value}: no single rank has both the captured layers "
        "and the final hidden states; use --pp-size 1",
    ),
    (
        "attn_cp_size",
        1,
        lambda v: v == 1,
        "attention context parallel size is {value}: each rank holds a slice of the "
        "tokens; use --attn-cp-size 1",
    ),
    (
        "speculative_algorithm",
        None,
        lambda v: v is None,
        "speculative decoding ({value}) is on: its draft and verify passes drive the "
        "same capture; launch without --speculative-algorithm",
    ),
    (
        "enable_attn_tp_input_scattered",
        False,
        lambda v: not v,
        "attention TP input scattering is on: prefill rows are split across TP ranks; "
        "launch without --enable-attn-tp-input-scattered",
    ),
)


def settings_problems(args):
    """What in these (resolved) server args breaks capture, one line per problem."""
    problems = []
    for name, absent, good, why in _SERVER_ARGS:
        value = getattr(args, name, absent)
        if not good(value):
            problems.append(why.format(value=value))
    on, what = _prefill_graphs(args)
    if on:
        problems.append(
            f"{what} on: a replayed prefill graph skips the Python capture; launch "
            "without --enable-piecewise-cuda-graph / --enforce-piecewise-cuda-graph / "
            "--cuda-graph-backend-prefill (the hook turns them off by default)"
        )
    return problems


class _State:
    def __init__(self):
        self.patched = {}  # module name -> the variant patched
        self.errors = {}
        self.launch_checked = False
        # True on TP rank 0 once activation succeeded: the only process that writes.
        self.dumping = False
        self.directory = None
        self.layers = None
        self.model = None


_state = _State()


def install():
    """Puts the patching finder first on sys.meta_path (called by sitecustomize)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


class _Finder(importlib.abc.MetaPathFinder):
    """Lets the other finders locate the seam modules and wraps their loaders."""

    def find_spec(self, fullname, path, target=None):
        patch = _PATCHES.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _PatchingLoader(spec.loader, fullname, patch)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    """Runs the module as its own loader would, then patches it."""

    def __init__(self, inner, name, patch):
        self._inner, self._name, self._patch = inner, name, patch

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        try:
            variant = self._patch(module)
        except Exception as err:
            # The import itself goes on; the launch check and activation refuse to run
            # without the seam.
            _state.errors[self._name] = f"{type(err).__name__}: {err}"
            log.error("extract dump hook: cannot patch %s: %s", self._name, _state.errors[self._name])
        else:
            _state.patched[self._name] = variant

    def __getattr__(self, name):
        # get_source, get_filename, get_code, ...: inspect, linecache and torch.compile
        # ask the module's loader for these. (_inner itself is never delegated, so an
        # instance made without __init__ raises instead of recursing.)
        if name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)


class _SeamError(Exception):
    pass


def _params(func):
    return list(inspect.signature(func).parameters)


def _patch_server_args(module):
    cls = module.ServerArgs
    post_init = getattr(cls, "__post_init__", None)
    if post_init is None:
        raise _SeamError("ServerArgs has no __post_init__")
    fields = {f.name for f in dataclasses.fields(cls)}
    if "disable_prefill_cuda_graph" in fields:
        switch = "disable_prefill_cuda_graph"
    elif "disable_piecewise_cuda_graph" in fields:
        switch = "disable_piecewise_cuda_graph"
    else:
        switch = None

    @functools.wraps(post_init)
    def patched(self, *args, **kwargs):
        if switch is not None:
            # Default graphs off; an explicit backend or enforce flag still wins over
            # this in SGLang's resolution, and the check below refuses it then.
            setattr(self, switch, True)
        post_init(self, *args, **kwargs)
        launch_check(self)

    cls.__post_init__ = patched
    return f"ServerArgs.__post_init__ ({switch or 'no prefill graph switch'})"


def _patch_logits_processor(module):
    cls = module.LogitsProcessor
    forward = cls.forward
    names = _params(forward)[1:]
    missing = [n for n in _LOGITS_ARGS if n not in names]
    if missing:
        raise _SeamError(f"LogitsProcessor.forward has no parameter {', '.join(missing)}")
    where = {n: names.index(n) for n in _LOGITS_ARGS}

    def arg(args, kwargs, name):
        i = where[name]
        return args[i] if i < len(args) else kwargs.get(name)

    @functools.wraps(forward)
    def patched(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        if _state.dumping:
            batch = arg(args, kwargs, "logits_metadata")
            if batch.forward_mode.is_extend():
                _dump(batch, arg(args, kwargs, "hidden_states"), arg(args, kwargs, "aux_hidden_states"))
        return out

    cls.forward = patched
    return "LogitsProcessor.forward"


def _dump(batch, hidden_states, aux_hidden_states):
    reqs = getattr(batch, _REQS_ATTR, None)
    # The flat [T] ids of the batch. LogitsProcessor's own input_ids argument is None
    # for Kimi-K2.5, whose language model runs on input_embeds.
    input_ids = getattr(batch, "input_ids", None)
    if reqs is None or aux_hidden_states is None:
        missing = "request ids" if reqs is None else "aux hidden states"
        # A bug in the seams, not a transient: stop rather than run without dumps.
        raise RuntimeError(f"{FATAL_PREFIX}extend forward without {missing}: the dump hook does not fit this SGLang")
    capture.write_batch(
        _state.directory,
        _state.layers,
        _state.model,
        reqs,
        batch,
        input_ids,
        hidden_states,
        aux_hidden_states,
    )


def annotate(forward_batch, batch):
    """Copies (rid, prompt length) of batch.reqs onto forward_batch for the logits
    processor; checks them against ForwardBatch.rids where SGLang sets that."""
    if not (_state.dumping and forward_batch.forward_mode.is_extend()):
        return
    reqs = getattr(batch, "reqs", None)
    if reqs is None:
        return
    entries = [(req.rid, len(req.origin_input_ids)) for req in reqs]
    rids = getattr(forward_batch, "rids", None)
    if rids is not None and list(rids) != [rid for rid, _ in entries]:
        raise RuntimeError(f"{FATAL_PREFIX}ForwardBatch.rids {list(rids)} differ from the batch's requests {[r for r, _ in entries]}")
    setattr(forward_batch, _REQS_ATTR, entries)


def _patch_forward_batch(module):
    cls = module.ForwardBatch
    fields = {f.name for f in dataclasses.fields(cls)}
    missing = [n for n in _BATCH_FIELDS if n not in fields]
    if missing:
        raise _SeamError(f"ForwardBatch has no field {', '.join(missing)}")
    init_new = inspect.getattr_static(cls, "init_new")
    if not isinstance(init_new, classmethod):
        raise _SeamError("ForwardBatch.init_new is not a classmethod")
    func = init_new.__func__
    names = _params(func)
    if names[1:2] != ["batch"]:
        raise _SeamError(f"ForwardBatch.init_new takes {names[1:]}, want batch first")

    @functools.wraps(func)
    def patched(klass, *args, **kwargs):
        forward_batch = func(klass, *args, **kwargs)
        annotate(forward_batch, args[0] if args else kwargs["batch"])
        return forward_batch

    cls.init_new = classmethod(patched)
    return "ForwardBatch.init_new(batch.reqs)" + (" + rids" if "rids" in fields else "")


def _runner_rank(sig):
    """How ModelRunner.__init__ names its TP rank: a tp_rank argument (until #31161) or
    a ParallelState ps (after)."""
    if "tp_rank" in sig.parameters:
        return "tp_rank", lambda bound: bound.arguments["tp_rank"]
    if "ps" in sig.parameters:
        return "ps.tp_rank", lambda bound: bound.arguments["ps"].tp_rank
    return None, None


def _patch_model_runner(module):
    cls = module.ModelRunner
    init = cls.__init__
    sig = inspect.signature(init)
    variant, rank_of = _runner_rank(sig)
    if variant is None:
        raise _SeamError("ModelRunner.__init__ takes neither tp_rank nor ps (its TP rank)")
    if "server_args" not in sig.parameters:
        raise _SeamError("ModelRunner.__init__ has no parameter server_args")

    @functools.wraps(init)
    def patched(self, *args, **kwargs):
        bound = sig.bind(self, *args, **kwargs)
        server_args = bound.arguments["server_args"]
        # Checked before the weights load, so a bad launch fails in seconds, not after
        # the model has been read (the launch check in the main process already did;
        # this covers an Engine built in-process).
        settings = _prepare(server_args)
        init(self, *args, **kwargs)
        _activate(self, settings, server_args, rank_of(bound))

    cls.__init__ = patched
    return f"ModelRunner.__init__ ({variant})"


def _check_schedule_batch(module):
    # #25516 removed ModelWorkerBatch; init_new then gets the ScheduleBatch.
    holder = getattr(module, "ModelWorkerBatch", None) or getattr(module, "ScheduleBatch", None)
    if holder is None:
        raise _SeamError("neither ModelWorkerBatch nor ScheduleBatch exists")
    if "reqs" not in {f.name for f in dataclasses.fields(holder)}:
        raise _SeamError(f"{holder.__name__} has no field reqs")
    # An attribute that __init__ assigns is named in its code object.
    if "origin_input_ids" not in module.Req.__init__.__code__.co_names:
        raise _SeamError("Req.__init__ sets no origin_input_ids")
    return f"{holder.__name__}.reqs"


_PATCHES = {
    SERVER_ARGS_MODULE: _patch_server_args,
    LOGITS_MODULE: _patch_logits_processor,
    BATCH_MODULE: _patch_forward_batch,
    RUNNER_MODULE: _patch_model_runner,
    SCHEDULE_MODULE: _check_schedule_batch,
}


def fatal_line(problems):
    return FATAL_PREFIX + "the dump hook cannot capture hidden states: " + "; ".join(problems)


def _fail(problems):
    message = fatal_line(problems)
    log.error(message)
    # Also straight to stderr: it must reach the server log whatever logging does.
    print(message, file=sys.stderr, flush=True)
    raise RuntimeError(message)


def launch_check(server_args):
    """Runs once in the launching process, right after ServerArgs resolves: refuses
    bad settings or missing seams by exiting with EXIT_REFUSED before weights load."""
    if _state.launch_checked:
        return
    _state.launch_checked = True
    try:
        _prepare(server_args)
    except RuntimeError:
        raise SystemExit(EXIT_REFUSED)


def _prepare(server_args):
    """Checks the environment, the seams and the server settings; returns (dir, layers)."""
    problems = []
    directory = os.environ.get("SGLANG_HS_DIR", "")
    if not os.path.isdir(directory):
        problems.append(f"SGLANG_HS_DIR={directory!r} is not a directory")
    elif not os.access(directory, os.W_OK):
        problems.append(f"SGLANG_HS_DIR={directory!r} is not writable")
    layers = None
    try:
        layers = writer.parse_layers(os.environ.get("SGLANG_HS_LAYERS", ""))
    except ValueError as err:
        problems.append(f"SGLANG_HS_LAYERS: {err}")
    problems += [f"{name}: {why}" for name, why in seam_report().items() if why is not None and not why.startswith("ok:")]
    problems += settings_problems(server_args)
    if problems:
        _fail(problems)
    if getattr(server_args, "enable_flashinfer_allreduce_fusion", False):
        # Before v0.5.15 SGLang turns this on by itself for DeepSeek-V3 and Kimi-K2.5 on
        # one SM90/SM100 node. Fused, a layer's MLP output stays un-reduced until the
        # next layer's norm (communicator.py, should_fuse_mlp_allreduce_with_next_layer),
        # so the hidden_states + residual captured before that layer would hold one
        # rank's partial sum. Every rank runs this same code, so all of them turn it off.
        # From v0.5.15 on the flag is an alias reset to False (the switch is
        # flashinfer_allreduce_fusion_backend) and the capture follows the fused
        # all-reduce, so this never fires there and the backend stays (README.md).
        log.warning("extract dump hook: turning off FlashInfer all-reduce fusion, which would corrupt the captured layers")
        server_args.enable_flashinfer_allreduce_fusion = False
    return directory, layers


def seam_report():
    """Imports every seam module (patching it) and says, per module, "ok: <variant>" or
    what is wrong. The doctor probe prints this; the launch check refuses on any
    problem."""
    report = {}
    for name in _PATCHES:
        try:
            importlib.import_module(name)
        except Exception as err:
            report[name] = f"cannot be imported: {type(err).__name__}: {err}"
            continue
        if name in _state.errors:
            report[name] = _state.errors[name]
        elif name not in _state.patched:
            report[name] = "was imported before the hook was installed (is the hook's folder on PYTHONPATH?)"
        else:
            report[name] = "ok: " + _state.patched[name]
    return report


def _num_layers(model):
    """num_hidden_layers of a DeepseekV2/V3 model or of Kimi-K2.5, which keeps it under
    config.text_config."""
    for m in (model, getattr(model, "language_model", None)):
        config = getattr(m, "config", None)
        for c in (config, getattr(config, "text_config", None)):
            n = getattr(c, "num_hidden_layers", None)
            if isinstance(n, int):
                return n
    return None


def _effective_layers(model):
    for m in (model, getattr(model, "language_model", None)):
        holder = getattr(m, "model", None)
        if holder is not None and hasattr(holder, "layers_to_capture"):
            return list(holder.layers_to_capture)
    return None


def set_capture_layers(model, layers):
    """Turns on the model's aux capture through its own set_eagle3_layers_to_capture so
    that layers_to_capture == layers; returns the effective list or fails.

    SGLang adds one to each id (layer i captures its input, the output of layer i-1);
    since late 2026 it adds it only when the first id is 1 (SpecForge's [1, 29, 57]).
    Either way the ids minus one give our list when they start at 2; otherwise the ids
    as given do on versions that take them as they are.
    """
    target = next(
        (m for m in (model, getattr(model, "language_model", None)) if callable(getattr(m, "set_eagle3_layers_to_capture", None))),
        None,
    )
    if target is None:
        _fail([f"{type(model).__name__} (nor its language_model) has no set_eagle3_layers_to_capture"])
    num_layers = _num_layers(model)
    if num_layers is None:
        _fail([f"{type(model).__name__}: no num_hidden_layers in its config nor its text_config"])
    if layers[-1] >= num_layers:
        _fail([f"layers {list(layers)}: the model has {num_layers} layers, so the last capture point is {num_layers - 1}"])
    effective = None
    for ids in ([layer - 1 for layer in layers], list(layers)):
        target.set_eagle3_layers_to_capture(ids)
        effective = _effective_layers(model)
        if effective == list(layers):
            return effective
    _fail([f"{type(target).__name__} captures layers {effective} after set_eagle3_layers_to_capture, want {list(layers)}"])


def _activate(runner, settings, server_args, tp_rank):
    """Turns on the model's aux capture, checks the effective layers, and on TP rank 0
    writes the marker and starts dumping."""
    directory, layers = settings
    set_capture_layers(runner.model, layers)
    _state.directory, _state.layers = directory, layers
    _state.model = str(server_args.model_path)
    _state.dumping = tp_rank == 0
    if not _state.dumping:
        return
    writer.remove_stale_markers(directory)
    marker = writer.write_marker(
        directory,
        os.getpid(),
        {
            "sglang_version": sglang_version(),
            "layers": writer.format_layers(layers),
            "model": _state.model,
            "tp_size": getattr(server_args, "tp_size", None),
        },
    )
    log.info(
        "extract dump hook active: layers %s of %s dumped to %s (marker %s)",
        writer.format_layers(layers),
        _state.model,
        directory,
        marker,
    )


def sglang_version():
    try:
        from sglang.version import __version__

        return str(__version__)
    except Exception:
        return getattr(sys.modules.get("sglang"), "__version__", "unknown")
