"""Drives one extend batch through SGLang's real model code with the dump hook armed.

Run by test_real_sglang.py (and on the device) in a fresh interpreter:

    python real_sglang_driver.py <sglang-src>/python <spec.json>

The SGLang files come unmodified from ../shared/sglang-src/<version>/python. Only what
is not there is stubbed, by a finder placed last on sys.meta_path: a module that no
other finder can locate (CUDA kernels, distributed, quantization, transformers, the
rest of sglang) becomes a permissive stand-in. torch is the real one. The model
objects are the real classes (KimiK25ForConditionalGeneration, DeepseekV3ForCausalLM,
DeepseekV2Model, LogitsProcessor) with small real tensors in place of the weights; each
decoder layer is a small torch module doing what SGLang's layer communicator does for
capture (append hidden_states + residual when asked), since communicator.py and the
attention/MoE kernels are not in ../shared. Prints one JSON object on stdout.
"""

import functools
import importlib.abc
import importlib.machinery
import json
import os
import sys
import types

HOOK_DIR = os.path.dirname(os.path.abspath(__file__))


class _MagicMeta(type):
    """Stand-ins are classes of this metaclass: usable as a base class, a decorator, a
    context manager, a type in annotations, a falsy flag, a callable returning another
    stand-in."""

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _magic(name)

    def __call__(cls, *args, **kwargs):
        if cls.__dict__.get("_root"):
            if len(args) == 1 and not kwargs and isinstance(args[0], (types.FunctionType, type)) and not isinstance(args[0], _MagicMeta):
                return args[0]  # used as a decorator
            return _magic(cls.__name__ + "()")
        return super().__call__(*args, **kwargs)

    def __getitem__(cls, item):
        return cls

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __iter__(cls):
        return iter(())

    def __lt__(cls, other):
        return False

    __gt__ = __le__ = __ge__ = __lt__

    def __add__(cls, other):
        return cls

    __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __add__

    def __bool__(cls):
        return False

    def __len__(cls):
        return 0

    def __enter__(cls):
        return cls

    def __exit__(cls, *exc):
        return False

    def __int__(cls):
        return 0

    def __index__(cls):
        return 0


class _MagicBase(metaclass=_MagicMeta):
    def __init_subclass__(cls, **kwargs):
        # msgspec.Struct subclasses pass options (tag=True, ...).
        super().__init_subclass__()

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _magic(name)


    def __init__(self, *args, **kwargs):
        pass


def _magic(name):
    return _MagicMeta(str(name), (_MagicBase,), {"_root": True})


class _MagicModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        value = _magic(name)
        setattr(self, name, value)
        return value


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        module = _MagicModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


# SGLang's own heavy dependencies: stand-ins even where installed (a GPU box has some
# of them), so that every machine runs the same code.
ALWAYS_STUB = ("transformers", "sgl_kernel", "flashinfer", "vllm", "deep_gemm", "xgrammar", "outlines", "msgspec", "zmq", "fastapi", "uvicorn", "pydantic", "orjson", "mooncake", "nixl", "torch_memory_saver", "compressed_tensors", "quack", "flash_attn", "tilelang", "huggingface_hub", "tokenizers")


class _AlwaysStubFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in ALWAYS_STUB:
            _StubFinder.STUBBED.append(fullname)
            return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)
        return None


def _imported_by_sglang():
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith("<frozen"):
        frame = frame.f_back
    return frame is not None and os.sep + "sglang" + os.sep in frame.f_code.co_filename


class _StubFinder(importlib.abc.MetaPathFinder):
    """Last on sys.meta_path: whatever nothing else finds is a stand-in."""

    STUBBED = []

    def find_spec(self, fullname, path, target=None):
        top = fullname.split(".")[0]
        if top in ("torch", "numpy", "extract_hook", "json", "sitecustomize"):
            return None
        if top != "sglang" and top in sys.modules and not isinstance(sys.modules[top], _MagicModule):
            # A missing submodule of a real package: let the import fail as it would.
            return None
        if top != "sglang" and not _imported_by_sglang():
            # torch's and other libraries' optional imports fail as they would.
            return None
        self.STUBBED.append(fullname)
        return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)


def main():
    src, spec_path = sys.argv[1:3]
    spec = json.load(open(spec_path))
    sys.path[:0] = [HOOK_DIR, src]
    os.environ["SGLANG_HS_DIR"] = spec["dir"]
    os.environ["SGLANG_HS_LAYERS"] = spec["layers"]

    import torch
    from torch import nn

    if not hasattr(torch, "compile"):
        # torch 1.13 (Debian's, for CI) predates torch.compile; SGLang only decorates
        # helpers with it. Eager is what compile does on the first call anyway.
        def compile(fn=None, **kwargs):
            return fn if fn is not None else (lambda f: f)

        torch.compile = compile

    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "uint16", "uint32", "uint64"):
        # Newer dtypes that SGLang names at import time; never used on this path.
        if not hasattr(torch, name):
            setattr(torch, name, torch.int8)

    # After torch, so that its own optional imports see what really is installed.
    sys.meta_path.append(_StubFinder())
    sys.meta_path.insert(0, _AlwaysStubFinder())

    from extract_hook import capture, seams

    seams.install()
    report = seams.seam_report()
    out = {"seams": report}
    problems = {k: v for k, v in report.items() if not v.startswith("ok:")}
    if problems:
        out["error"] = "seams: " + json.dumps(problems)
        print(json.dumps(out))
        return

    import dataclasses

    from sglang.srt import server_args as sa
    from sglang.srt.layers import logits_processor as lp

    # The scheduler's global server args: every field at its real default, without
    # __post_init__ (which resolves against the GPU and the model).
    args = sa.ServerArgs.__new__(sa.ServerArgs)
    for f in dataclasses.fields(sa.ServerArgs):
        if f.default is not dataclasses.MISSING:
            object.__setattr__(args, f.name, f.default)
        elif f.default_factory is not dataclasses.MISSING:
            object.__setattr__(args, f.name, f.default_factory())
    args.disable_radix_cache, args.chunked_prefill_size = True, -1
    sa.set_global_server_args_for_scheduler(args)
    from sglang.srt.model_executor import forward_batch_info as fbi
    from sglang.srt.model_executor import model_runner as mr
    from sglang.srt.models import deepseek_v2 as dsv2

    device = torch.device(spec.get("device", "cpu"))
    dtype = torch.bfloat16
    H, V, L = spec["hidden"], spec["vocab"], spec["num_layers"]
    gen = torch.Generator().manual_seed(spec["seed"])

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    # Later commits' decoder layers also return DSA top-k indices.
    import inspect

    returns_three = "residual, topk_indices = layer(" in inspect.getsource(dsv2.DeepseekV2Model.forward)
    has_rids = "rids" in {f.name for f in __import__("dataclasses").fields(fbi.ForwardBatch)}

    class Layer(nn.Module):
        """One decoder layer's arithmetic, small; capture as communicator.py does it."""

        def __init__(self, i):
            super().__init__()
            self.i = i
            self.w = rand(H)

        def forward(self, positions, hidden_states, forward_batch, residual, *args, captured_last_layer_outputs=None, **kwargs):
            if captured_last_layer_outputs is not None:
                captured_last_layer_outputs.append(hidden_states if residual is None else hidden_states + residual)
            residual = hidden_states if residual is None else hidden_states + residual
            hidden_states = torch.tanh(hidden_states * self.w) + self.i
            # The pinned commit's layers return two values, later ones three.
            return (hidden_states, residual, None) if returns_three else (hidden_states, residual)

    class Norm(nn.Module):
        def forward(self, hidden_states, residual=None):
            out = (hidden_states if residual is None else hidden_states + residual) * 0.5
            return out if residual is None else (out, residual)

    pp = types.SimpleNamespace(is_first_rank=True, is_last_rank=True, world_size=1, rank_in_group=0)
    text_config = types.SimpleNamespace(num_hidden_layers=L, hidden_size=H, vocab_size=V, tie_word_embeddings=False, final_logit_softcapping=None)

    model = dsv2.DeepseekV2Model.__new__(dsv2.DeepseekV2Model)
    nn.Module.__init__(model)
    embed = nn.Embedding(V, H).to(dtype).to(device)
    with torch.no_grad():
        embed.weight.copy_(rand(V, H))
    model.embed_tokens = embed
    model.layers = nn.ModuleList(Layer(i) for i in range(L))
    model.norm = Norm()
    for name, value in dict(
        config=text_config, start_layer=0, end_layer=L, pp_group=pp, layers_to_capture=[],
        first_k_dense_replace=3, cp_size=None, enable_a2a_moe=False, llama_4_scaling_config=None,
        use_nsa=False, use_dsa=False, nsa_enable_prefill_cp=False, dsa_enable_prefill_cp=False,
        mla_enable_prefill_cp=False, next_full_attention_layer_id={}, vocab_size=V, padding_id=0,
    ).items():
        object.__setattr__(model, name, value)
    model._dsa_forward_uses_topk = lambda: False

    lm = dsv2.DeepseekV3ForCausalLM.__new__(dsv2.DeepseekV3ForCausalLM)
    nn.Module.__init__(lm)
    lm.model = model
    head = nn.Module()
    head.weight = nn.Parameter(rand(V, H), requires_grad=False)
    lm.lm_head = head
    # Its real __init__, with the distributed and server-args helpers stubbed (falsy).
    processor = lp.LogitsProcessor(text_config)
    lm.logits_processor = processor
    for name, value in dict(
        config=text_config, pp_group=pp, capture_aux_hidden_states=False, cp_rank=None, cp_size=None,
        use_nsa=False, use_dsa=False, nsa_enable_prefill_cp=False, dsa_enable_prefill_cp=False,
        mla_enable_prefill_cp=False, tp_size=1,
    ).items():
        object.__setattr__(lm, name, value)

    logits_seen = []
    patched_forward = lp.LogitsProcessor.forward
    assert getattr(patched_forward, "__wrapped__", None) is not None, "LogitsProcessor.forward is not patched"
    real_forward = patched_forward.__wrapped__

    @functools.wraps(real_forward)
    def spy(self, input_ids, *args, **kwargs):
        logits_seen.append(input_ids is None)
        return real_forward(self, input_ids, *args, **kwargs)

    # The hook's wrapper calls the real LogitsProcessor.forward through this spy.
    lp.LogitsProcessor.forward = spy
    seams._patch_logits_processor(lp)

    if spec["model"] == "kimi":
        from sglang.srt.models import kimi_k25

        top = kimi_k25.KimiK25ForConditionalGeneration.__new__(kimi_k25.KimiK25ForConditionalGeneration)
        nn.Module.__init__(top)
        object.__setattr__(top, "config", types.SimpleNamespace(text_config=text_config))
        top.language_model = lm
    else:
        top = lm

    # What ModelRunner.__init__'s patch does after the model loads, on TP rank 0.
    layers = tuple(int(x) for x in spec["layers"].split(","))
    effective = seams.set_capture_layers(top, layers)
    seams._state.directory, seams._state.layers, seams._state.model = spec["dir"], layers, spec["model_path"]
    seams._state.dumping = True
    out["effective_layers"] = effective
    out["runner_variant"] = seams._state.patched[seams.RUNNER_MODULE]

    # One extend batch of several requests, as ForwardBatch.init_new builds it.
    requests = spec["requests"]
    ids = torch.tensor([t for r in requests for t in r["ids"]], dtype=torch.int64, device=device)
    positions = torch.cat([torch.arange(len(r["ids"])) for r in requests]).to(device)
    fb = fbi.ForwardBatch.__new__(fbi.ForwardBatch)
    for name, value in dict(
        forward_mode=fbi.ForwardMode.EXTEND, batch_size=len(requests), input_ids=ids, positions=positions,
        extend_seq_lens_cpu=[len(r["ids"]) for r in requests], extend_prefix_lens_cpu=[0] * len(requests),
        seq_lens_cpu=torch.tensor([len(r["ids"]) for r in requests]), mm_inputs=None, input_embeds=None,
        can_run_tbo=False, tbo_split_seq_index=None, attn_cp_metadata=None, return_logprob=False,
        extend_seq_lens=torch.tensor([len(r["ids"]) for r in requests], device=device),
        extend_prefix_lens=torch.zeros(len(requests), dtype=torch.int64, device=device),
        seq_lens=torch.tensor([len(r["ids"]) for r in requests], device=device),
        extend_logprob_start_lens_cpu=None, top_logprobs_nums=None, token_ids_logprobs=None,
        return_hidden_states=False, capture_hidden_mode=fbi.CaptureHiddenMode.NULL,
        spec_info=None, next_token_logits_buffer=None, dimensions=None, rids=[r["rid"] for r in requests] if has_rids else None,
    ).items():
        if not isinstance(getattr(fbi.ForwardBatch, name, None), property):
            object.__setattr__(fb, name, value)
    batch = types.SimpleNamespace(reqs=[types.SimpleNamespace(rid=r["rid"], origin_input_ids=r["ids"]) for r in requests])
    seams.annotate(fb, batch)

    with torch.no_grad():
        top.forward(ids, positions, fb)
    capture.flush()
    out["logits_input_ids_none"] = logits_seen
    # The rows the dumps must hold, computed here from the same model: the final
    # hidden states and the inputs of the captured layers.
    with torch.no_grad():
        h = embed(ids)
        residual = None
        captured = []
        for i, layer in enumerate(model.layers):
            if i in layers:
                captured.append(h if residual is None else h + residual)
            residual = h if residual is None else h + residual
            h = torch.tanh(h * layer.w) + i
        final = (h + residual) * 0.5
    expect_dir = spec["expect_dir"]
    start = 0
    for r in requests:
        end = start + len(r["ids"])
        with open(os.path.join(expect_dir, r["rid"] + ".bin"), "wb") as f:
            for t in (torch.cat([c[start:end] for c in captured], dim=1), final[start:end], ids[start:end]):
                f.write(t.contiguous().cpu().view(torch.uint8).numpy().tobytes())
        start = end
    out["stubbed_sglang_modules"] = len([m for m in _StubFinder.STUBBED if m.startswith("sglang")])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
