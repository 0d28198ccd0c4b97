"""NOT transformers: a tiny torch module standing in for a causal LM in CPU tests.

CI has torch (Debian's python3-torch) but no transformers, so the tests load this
through HFSERVER_BACKEND=tinymodel:load and exercise everything of the server except
the model call. Its hidden states are known in closed form, exact in bf16:

    hidden_states[0][p, j] = (id_p + j) % 64                 (the "embeddings")
    hidden_states[k][p, j] = hidden_states[0][p, j] + k * (c_p % 8)
    final[p, j]            = hidden_states[L][p, j] / 2      (the "norm")

where c_p is the number of attended positions up to p (p + 1 for a right-padded row,
computed from the attention mask, so padding that leaked would change it).
TINY_LAYERS and TINY_HIDDEN set the shape (defaults 4 and 16). TINY_DELAY delays each
forward by that many seconds, so that requests pile up into batches in the tests.
TINY_GATE names a file: while it exists, every forward waits (a test holds requests in
flight for as long as it needs, without guessing at timings). TINY_DTYPE is the
states' dtype (default bfloat16; float32 stands for a model loaded in float32).
"""

import os
import time

import torch


class TinyLM(torch.nn.Module):
    def __init__(self, num_layers, hidden_size):
        super().__init__()
        self.num_layers, self.hidden_size = num_layers, hidden_size
        self.dtype = getattr(torch, os.environ.get("TINY_DTYPE", "bfloat16"))
        self.register_buffer("cols", torch.arange(hidden_size, dtype=torch.int64))

    def forward(self, input_ids, attention_mask):
        h = ((input_ids[..., None] + self.cols) % 64).to(self.dtype)
        step = (attention_mask.cumsum(-1) % 8)[..., None].to(self.dtype)
        states = [h]
        for _ in range(self.num_layers):
            h = h + step
            states.append(h)
        return states, h / 2


class TinyBackend:
    name = "tiny-test-module (not transformers)"
    vocab_size = None
    architectures = ["TinyLM"]
    tokenizer = None

    def __init__(self, num_layers, hidden_size):
        self.module = TinyLM(num_layers, hidden_size)
        self.num_layers, self.hidden_size = num_layers, hidden_size
        self.device = torch.device("cpu")
        self.delay = float(os.environ.get("TINY_DELAY", "0"))
        self.gate = os.environ.get("TINY_GATE", "")

    def forward(self, input_ids, attention_mask):
        if self.delay:
            time.sleep(self.delay)
        while self.gate and os.path.exists(self.gate):
            time.sleep(0.01)
        with torch.no_grad():
            return self.module(input_ids, attention_mask)


def load(model_path, options):
    return TinyBackend(int(os.environ.get("TINY_LAYERS", "4")), int(os.environ.get("TINY_HIDDEN", "16")))


def expected(ids, layers, num_layers=4, hidden_size=16):
    """(aux [T, 3H], final [T, H]) as float lists of lists, from the closed form."""
    aux, final = [], []
    for p, tok in enumerate(ids):
        base = [(tok + j) % 64 for j in range(hidden_size)]
        step = (p + 1) % 8
        aux.append([b + k * step for k in layers for b in base])
        final.append([(b + num_layers * step) / 2 for b in base])
    return aux, final
