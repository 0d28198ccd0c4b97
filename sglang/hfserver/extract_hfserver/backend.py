"""The model behind the server: one narrow call, so everything else runs without transformers.

A backend is any object with these attributes and one method:

    name          str, what /server_info reports ("transformers", or a test module's name)
    num_layers    int, decoder layers
    hidden_size   int
    vocab_size    int or None: input ids must lie in [0, vocab_size)
    device        torch.device the inputs go to
    architectures list of str (for /model_info)
    tokenizer     None, or a callable text -> list of int ids
    forward(input_ids, attention_mask) -> (hidden_states, final)

and may have

    capture(input_ids, attention_mask, layers) -> ([hidden_states[k] for k in layers], final)

which computes the same tensors without keeping every layer's output alive.

forward gets [B, S] int64 tensors (right-padded, attention_mask 1 on real tokens) and
returns hidden_states, a sequence of num_layers + 1 tensors [B, S, H] in Hugging Face's
output_hidden_states convention (entry 0 the embeddings, entry k the input of decoder
layer k, i.e. the output of layer k - 1), and final, the post-norm output [B, S, H].

Which backend loads is chosen by HFSERVER_BACKEND ("package.module:factory", called as
factory(model_path, options)); unset, it is load_transformers below. Tests set it to a
tiny torch module; production never does.
"""

import importlib
import os

BACKEND_ENV = "HFSERVER_BACKEND"


class Options:
    """What the command line says about loading: dtype, device layout, attention."""

    def __init__(self, dtype="bfloat16", tp_size=1, attn_implementation=""):
        self.dtype = dtype
        self.tp_size = tp_size
        self.attn_implementation = attn_implementation


def load(model_path, options):
    spec = os.environ.get(BACKEND_ENV, "")
    if not spec:
        return load_transformers(model_path, options)
    module, _, factory = spec.partition(":")
    if not module or not factory:
        raise ValueError(f"{BACKEND_ENV}={spec!r}: want package.module:factory")
    return getattr(importlib.import_module(module), factory)(model_path, options)


class TransformersBackend:
    name = "transformers"

    def __init__(self, model, tokenizer, device):
        import torch

        self._torch = torch
        self.model = model
        # The base model (LlamaModel inside LlamaForCausalLM): it returns the post-norm
        # last_hidden_state and the hidden_states tuple without computing logits over the
        # whole prompt, which for a 160k vocabulary would cost more than the layers.
        self.base = model.base_model
        cfg = model.config
        text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        self.num_layers = int(text.num_hidden_layers)
        self.hidden_size = int(text.hidden_size)
        self.vocab_size = int(text.vocab_size) if getattr(text, "vocab_size", None) else None
        self.architectures = list(getattr(cfg, "architectures", None) or [type(model).__name__])
        self.device = device
        self.tokenizer = None
        if tokenizer is not None:
            self.tokenizer = lambda text: list(tokenizer(text, add_special_tokens=True)["input_ids"])

    def forward(self, input_ids, attention_mask):
        with self._torch.inference_mode():
            out = self.base(
                input_ids=input_ids,
                attention_mask=attention_mask,
                output_hidden_states=True,
                use_cache=False,
                return_dict=True,
            )
        return out.hidden_states, out.last_hidden_state

    def capture(self, input_ids, attention_mask, layers):
        """Forward pre-hooks on the captured decoder layers only: output_hidden_states
        keeps all num_layers + 1 outputs alive until the forward returns, which at 61
        layers is 20x the memory of the three kept here. hidden_states[k] is the input of
        decoder layer k (device_transformers.py checks that on the installed transformers),
        so the tensors, and the dumps, are the same bit for bit."""
        decoder = getattr(self.base, "layers", None)
        if decoder is None or len(decoder) != self.num_layers:
            hidden_states, final = self.forward(input_ids, attention_mask)
            return [hidden_states[k] for k in layers], final
        got = {}

        def keep(k):
            def hook(module, args, kwargs):
                got[k] = args[0] if args else kwargs["hidden_states"]

            return hook

        handles = [decoder[k].register_forward_pre_hook(keep(k), with_kwargs=True) for k in layers]
        try:
            with self._torch.inference_mode():
                out = self.base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, return_dict=True)
        finally:
            for h in handles:
                h.remove()
        return [got[k] for k in layers], out.last_hidden_state


def load_transformers(model_path, options):
    """Loads model_path (a local folder; the hub is never asked) onto the visible GPUs."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    import transformers

    dtype = getattr(torch, options.dtype)
    kwargs = {"local_files_only": True}
    if options.attn_implementation:
        kwargs["attn_implementation"] = options.attn_implementation
    gpus = torch.cuda.device_count()
    if gpus and hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        # cuDNN's SDPA kernels were slow and serialised on an H200 for these shapes (bf16,
        # a padding mask, one forward after another): the job missed its target until
        # SDPA took the flash or memory-efficient kernels instead (docs/performance.md).
        torch.backends.cuda.enable_cudnn_sdp(False)
    if gpus == 0:
        device = torch.device("cpu")
    elif options.tp_size > 1:
        # Not tensor parallel: accelerate places whole layers on each visible GPU in
        # turn, and activations hop between them (one GPU computes at a time).
        kwargs["device_map"] = "auto"
        device = torch.device("cuda:0")
    else:
        kwargs["device_map"] = {"": 0}
        device = torch.device("cuda:0")
    try:
        model = _from_pretrained(transformers, model_path, dtype, kwargs)
    except (ImportError, ValueError) as e:
        # A device_map needs accelerate on some transformers; one GPU does without it.
        if "accelerate" not in str(e) or options.tp_size > 1:
            raise
        kwargs.pop("device_map", None)
        model = _from_pretrained(transformers, model_path, dtype, kwargs)
    if "device_map" not in kwargs:
        model.to(device)
    model.eval()
    if options.tp_size > 1:
        # Inputs go where the embeddings are.
        device = model.get_input_embeddings().weight.device
    tokenizer = None
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    except Exception as e:  # a folder with weights only: text samples are refused
        print(f"extract-hfserver: no tokenizer in {model_path} ({type(e).__name__}); text requests will be refused", flush=True)
    return TransformersBackend(model, tokenizer, device)


def _from_pretrained(transformers, model_path, dtype, kwargs):
    try:
        return transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, **kwargs)
    except TypeError:
        # transformers before 4.56 names the argument torch_dtype.
        return transformers.AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=dtype, **kwargs)
