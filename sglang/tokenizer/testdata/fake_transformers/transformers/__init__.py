"""A stand-in for transformers' AutoTokenizer, for testing extract's prepare worker on a
machine without transformers. It implements only what the worker calls, on a
byte-level tokenizer described by <folder>/fake_tokenizer.json:

  {"chat_template": "...", "eos_token": "<|im_end|>",
   "specials": {"<|im_start|>": 1, "<|im_end|>": 2},
   "merges": {"\\nA": 300}}   # optional: two-character strings that become one token

Each UTF-8 byte b is token b+3 (the simulator's contract), a special token's text is its
id, a merge joins two characters into one token wherever they meet (so a render cut
between them tokenizes differently: what the token-prefix method must catch).
FAKE_EXIT_SECONDS delays the interpreter's exit, as real transformers' shutdown does;
FAKE_ENCODE_SECONDS makes each encode call in a forked worker that long (a worker busy
in a batch; the loading process's own check encode is not delayed), and
FAKE_ENCODE_STARTED names a file it creates as that wait begins;
FAKE_LOAD_LOG names a file that gets a line per from_pretrained (loads are counted), with
whether torch was hidden; FAKE_NEEDS_TORCH fails a load with torch hidden, as a
tokenizer's remote code that imports torch would, and FAKE_NEEDS_TORCH_TO_ENCODE fails
every encode with torch hidden (remote code that imports it only when it runs).
"""

import atexit
import json
import os
import sys
import time

if os.environ.get("FAKE_EXIT_SECONDS"):
    atexit.register(time.sleep, float(os.environ["FAKE_EXIT_SECONDS"]))


class FakeTokenizer:
    is_fast = True

    def __init__(self, spec):
        self.loaded_by = os.getpid()
        self.chat_template = spec["chat_template"]
        self.specials = spec.get("specials") or {}
        self.merges = spec.get("merges") or {}
        self.eos_token = spec.get("eos_token")
        self.eos_token_id = self.specials.get(self.eos_token)
        self.unk_token = None
        self.unk_token_id = None
        self.special_tokens_map = {"eos_token": self.eos_token} if self.eos_token else {}
        self.inverse = {v: k for k, v in list(self.specials.items()) + list(self.merges.items())}

    def __len__(self):
        return max([259] + [v + 1 for v in self.inverse])

    def convert_tokens_to_ids(self, name):
        return self.specials.get(name, self.merges.get(name))

    def _encode(self, text):
        ids, offs, i = [], [], 0
        while i < len(text):
            for s, v in self.specials.items():
                if text.startswith(s, i):
                    ids.append(v)
                    offs.append((i, i + len(s)))
                    i += len(s)
                    break
            else:
                pair = text[i:i + 2]
                if len(pair) == 2 and pair in self.merges:
                    ids.append(self.merges[pair])
                    offs.append((i, i + 2))
                    i += 2
                    continue
                for b in text[i].encode("utf-8"):
                    ids.append(b + 3)
                    offs.append((i, i + 1))
                i += 1
        return ids, offs

    def __call__(self, texts, add_special_tokens=False, return_offsets_mapping=False):
        assert add_special_tokens is False
        if os.environ.get("FAKE_NEEDS_TORCH_TO_ENCODE") and sys.modules.get("torch", 0) is None:
            raise ImportError("No module named 'torch' (this tokenizer's encode imports it)")
        if os.environ.get("FAKE_ENCODE_SECONDS") and os.getpid() != self.loaded_by:
            if os.environ.get("FAKE_ENCODE_STARTED"):
                open(os.environ["FAKE_ENCODE_STARTED"], "w").close()
            time.sleep(float(os.environ["FAKE_ENCODE_SECONDS"]))
        encs = [self._encode(t) for t in texts]
        out = {"input_ids": [e[0] for e in encs]}
        if return_offsets_mapping:
            out["offset_mapping"] = [e[1] for e in encs]
        return out

    def decode(self, ids):
        out = b""
        for i in ids:
            if i in self.inverse:
                out += self.inverse[i].encode()
            else:
                out += bytes([i - 3])
        return out.decode("utf-8", errors="replace")


class AutoTokenizer:
    @staticmethod
    def from_pretrained(path, local_files_only=False, trust_remote_code=False):
        assert local_files_only, "the worker must load offline"
        hidden = "torch" in sys.modules and sys.modules["torch"] is None
        if os.environ.get("FAKE_LOAD_LOG"):
            with open(os.environ["FAKE_LOAD_LOG"], "a") as f:
                f.write(f"{os.getpid()} torch_hidden={hidden}\n")
        if os.environ.get("FAKE_NEEDS_TORCH") and hidden:
            raise ImportError("No module named 'torch' (this tokenizer's code imports it)")
        with open(os.path.join(path, "fake_tokenizer.json"), encoding="utf-8") as f:
            spec = json.load(f)
        if spec.get("needs_remote_code") and not trust_remote_code:
            raise ValueError("this tokenizer needs trust_remote_code=True")
        return FakeTokenizer(spec)
