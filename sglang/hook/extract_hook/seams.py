"""The SGLang seams: an import hook that patches three SGLang modules as they load, and
the activation that runs in every scheduler process when SGLang builds its ModelRunner.

Read against sgl-project/sglang main at 7b0fb43c7a7e (2026-02-22, after v0.5.8):

- srt/model_executor/model_runner.py: ModelRunner.__init__(..., tp_rank, ...,
  server_args, ...) loads the model into self.model; its initialize() calls
  self.model.set_eagle3_layers_to_capture(...) for SGLang's own EAGLE-3 right after
  the decode CUDA graphs. We make the same call right after __init__.
- srt/models/deepseek_v2.py: DeepseekV2ForCausalLM.set_eagle3_layers_to_capture(ids)
  sets capture_aux_hidden_states and model.layers_to_capture = [id + 1 ...];
  DeepseekV2Model.forward appends hidden_states + residual before each listed layer and
  the ForCausalLM passes those and the final post-norm hidden states to
  self.logits_processor(input_ids, hidden_states, lm_head, forward_batch, aux).
- srt/models/kimi_k25.py: KimiK25ForConditionalGeneration holds a DeepseekV3ForCausalLM
  as .language_model and has no set_eagle3_layers_to_capture of its own.
- srt/layers/logits_processor.py: LogitsProcessor.forward(input_ids, hidden_states,
  lm_head, logits_metadata, aux_hidden_states=None, ...) sees every row of the batch
  before it prunes to one row per request.
- srt/model_executor/forward_batch_info.py: ForwardBatch.init_new(batch, model_runner)
  turns a ModelWorkerBatch into what the model sees (forward_mode,
  extend_seq_lens_cpu, extend_prefix_lens_cpu), but carries no request ids.
- srt/managers/schedule_batch.py: ModelWorkerBatch.reqs (since 2025-11, #13425) holds
  the batch's Req objects, with Req.rid and Req.origin_input_ids.
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

LOGITS_MODULE = "sglang.srt.layers.logits_processor"
BATCH_MODULE = "sglang.srt.model_executor.forward_batch_info"
RUNNER_MODULE = "sglang.srt.model_executor.model_runner"
SCHEDULE_MODULE = "sglang.srt.managers.schedule_batch"

# Where ForwardBatch.init_new leaves (rid, prompt length) per request for the logits
# processor, which sees the ForwardBatch but not the requests.
_REQS_ATTR = "_extract_hs_reqs"

_LOGITS_ARGS = ("input_ids", "hidden_states", "logits_metadata", "aux_hidden_states")
_BATCH_FIELDS = ("forward_mode", "extend_seq_lens_cpu", "extend_prefix_lens_cpu")

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
        "enable_piecewise_cuda_graph",
        False,
        lambda v: not v,
        "piecewise CUDA graphs are on: a replayed prefill skips the Python capture; "
        "launch without --enable-piecewise-cuda-graph",
    ),
    (
        "enable_attn_tp_input_scattered",
        False,
        lambda v: not v,
        "attention TP input scattering is on: prefill rows are split across TP ranks; "
        "launch without --enable-attn-tp-input-scattered",
    ),
)


class _State:
    def __init__(self):
        self.patched = set()
        self.errors = {}
        # True on TP rank 0 once activation succeeded: the only process that writes.
        self.dumping = False
        self.directory = None
        self.layers = None
        self.model = None


_state = _State()


def install():
    """Puts the patching finder first on sys.meta_path (called by sitecustomize)."""
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
            self._patch(module)
        except Exception as err:
            # The import itself goes on; activation refuses to run without the seam.
            _state.errors[self._name] = f"{type(err).__name__}: {err}"
            log.error("extract dump hook: cannot patch %s: %s", self._name, _state.errors[self._name])
        else:
            _state.patched.add(self._name)

    def __getattr__(self, name):
        # get_source, get_filename, get_code, ...: inspect, linecache and torch.compile
        # ask the module's loader for these. (_inner itself is never delegated, so an
        # instance made without __init__ raises instead of recursing.)
        if name == "_inner":
            raise AttributeError(name)
        return getattr(self._inner, name)


class _SeamError(Exception):
    pass


def _patch_logits_processor(module):
    cls = module.LogitsProcessor
    forward = cls.forward
    names = list(inspect.signature(forward).parameters)[1:]
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
                _dump(
                    batch,
                    arg(args, kwargs, "input_ids"),
                    arg(args, kwargs, "hidden_states"),
                    arg(args, kwargs, "aux_hidden_states"),
                )
        return out

    cls.forward = patched


def _dump(batch, input_ids, hidden_states, aux_hidden_states):
    reqs = getattr(batch, _REQS_ATTR, None)
    if reqs is None or aux_hidden_states is None:
        missing = "request ids" if reqs is None else "aux hidden states"
        log.error("extract dump hook: EXTEND forward without %s, nothing dumped for it", missing)
        return
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
    names = list(inspect.signature(func).parameters)
    if names[1:2] != ["batch"]:
        raise _SeamError(f"ForwardBatch.init_new takes {names[1:]}, want batch first")

    @functools.wraps(func)
    def patched(klass, *args, **kwargs):
        forward_batch = func(klass, *args, **kwargs)
        batch = args[0] if args else kwargs["batch"]
        if _state.dumping and batch.forward_mode.is_extend() and batch.reqs is not None:
            setattr(
                forward_batch,
                _REQS_ATTR,
                [(req.rid, len(req.origin_input_ids)) for req in batch.reqs],
            )
        return forward_batch

    cls.init_new = classmethod(patched)


def _patch_model_runner(module):
    cls = module.ModelRunner
    init = cls.__init__
    sig = inspect.signature(init)
    missing = [n for n in ("tp_rank", "server_args") if n not in sig.parameters]
    if missing:
        raise _SeamError(f"ModelRunner.__init__ has no parameter {', '.join(missing)}")

    @functools.wraps(init)
    def patched(self, *args, **kwargs):
        bound = sig.bind(self, *args, **kwargs)
        server_args = bound.arguments["server_args"]
        # Checked before the weights load, so a bad launch fails in seconds, not after
        # the model has been read.
        settings = _prepare(server_args)
        init(self, *args, **kwargs)
        _activate(self, settings, server_args, bound.arguments["tp_rank"])

    cls.__init__ = patched


_PATCHES = {
    LOGITS_MODULE: _patch_logits_processor,
    BATCH_MODULE: _patch_forward_batch,
    RUNNER_MODULE: _patch_model_runner,
}


def _fail(problems):
    message = "extract dump hook cannot capture hidden states:\n  - " + "\n  - ".join(problems)
    log.error(message)
    raise RuntimeError(message)


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
    problems += _seam_problems()
    for name, absent, good, why in _SERVER_ARGS:
        value = getattr(server_args, name, absent)
        if not good(value):
            problems.append(why.format(value=value))
    if problems:
        _fail(problems)
    if getattr(server_args, "enable_flashinfer_allreduce_fusion", False):
        # SGLang turns this on by itself for DeepSeek-V3 and Kimi-K2.5 on one SM90/SM100
        # node. Fused, a layer's MLP output stays un-reduced until the next layer's
        # norm (communicator.py, should_fuse_mlp_allreduce_with_next_layer), so the
        # hidden_states + residual captured before that layer would hold one rank's
        # partial sum. Every rank runs this same code, so all of them turn it off.
        log.warning("extract dump hook: turning off FlashInfer all-reduce fusion, which would corrupt the captured layers")
        server_args.enable_flashinfer_allreduce_fusion = False
    return directory, layers


def _seam_problems():
    problems = []
    for name in _PATCHES:
        try:
            importlib.import_module(name)
        except ImportError as err:
            problems.append(f"{name} cannot be imported: {err}")
            continue
        if name in _state.errors:
            problems.append(f"{name}: {_state.errors[name]}")
        elif name not in _state.patched:
            problems.append(f"{name} was imported before the hook was installed (is the hook's folder on PYTHONPATH?)")
    try:
        schedule = importlib.import_module(SCHEDULE_MODULE)
        if "reqs" not in {f.name for f in dataclasses.fields(schedule.ModelWorkerBatch)}:
            problems.append(f"{SCHEDULE_MODULE}: ModelWorkerBatch has no field reqs")
        # An attribute that __init__ assigns is named in its code object.
        if "origin_input_ids" not in schedule.Req.__init__.__code__.co_names:
            problems.append(f"{SCHEDULE_MODULE}: Req.__init__ sets no origin_input_ids")
    except (ImportError, AttributeError, TypeError) as err:
        problems.append(f"{SCHEDULE_MODULE}: {type(err).__name__}: {err}")
    return problems


def _activate(runner, settings, server_args, tp_rank):
    """Turns on the model's aux capture, checks the effective layers, and on TP rank 0
    writes the marker and starts dumping."""
    directory, layers = settings
    model = runner.model
    target = next(
        (
            m
            for m in (model, getattr(model, "language_model", None))
            if callable(getattr(m, "set_eagle3_layers_to_capture", None))
        ),
        None,
    )
    if target is None:
        _fail([f"{type(model).__name__} (nor its language_model) has no set_eagle3_layers_to_capture"])
    num_layers = getattr(getattr(target, "config", None), "num_hidden_layers", None)
    if not isinstance(num_layers, int):
        _fail([f"{type(target).__name__}.config has no num_hidden_layers"])
    if layers[-1] >= num_layers:
        _fail([f"layers {list(layers)}: the model has {num_layers} layers, so the last capture point is {num_layers - 1}"])
    # SGLang adds one to each id: layer i captures its input, the output of layer i-1.
    target.set_eagle3_layers_to_capture([layer - 1 for layer in layers])
    holders = [getattr(target, "model", None)]
    holders.append(getattr(getattr(target, "language_model", None), "model", None))
    effective = next(
        (list(h.layers_to_capture) for h in holders if hasattr(h, "layers_to_capture")),
        None,
    )
    if effective != list(layers):
        _fail([f"{type(target).__name__} captures layers {effective} after set_eagle3_layers_to_capture, want {list(layers)}"])
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
            "sglang_version": getattr(sys.modules.get("sglang"), "__version__", "unknown"),
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
