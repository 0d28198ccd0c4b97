#!/usr/bin/env python3
"""Helpers for scripts/device_prepare.sh: real Hugging Face tokenizers built locally, the
conversations, the checks against transformers' own apply_chat_template, and the
anchor of the throughput bench. Needs transformers and tokenizers; no network.

  build DIR                 three tokenizer folders under DIR (a byte-level BPE trained
                            here, saved with save_pretrained): tags/ (a chat template with
                            {% generation %} blocks), plain/ (the same text, no tags),
                            drop/ (like Qwen3: reasoning only in the last assistant turn)
  convs PATH N              N conversations in OpenAI form: system turns, 1-4 turns,
                            reasoning_content on some assistant turns
  check TOK CONVS PREPARED  every prepared record against
                            apply_chat_template(..., return_assistant_tokens_mask=True)
                            (--ids-only: ids, with masks compared to --masks-from)
  anchor TOK CONVS P        HF's apply_chat_template with masks in P processes
"""

import argparse
import json
import multiprocessing as mp
import os
import random
import re
import sys
import time

ROLE = "{{- '<|im_start|>' + m['role'] + '\\n' }}"
THINK = "{%- if m.reasoning_content is defined and m.reasoning_content %}{{- '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}"
GEN_PROMPT = "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
TEMPLATES = {
    "tags": "{%- for m in messages %}" + ROLE + "{%- if m['role'] == 'assistant' %}{%- generation %}" + THINK
            + "{{- m['content'] + '<|im_end|>' }}{%- endgeneration %}{{- '\\n' }}{%- else %}{{- m['content'] + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}" + GEN_PROMPT,
    "plain": "{%- for m in messages %}" + ROLE + "{%- if m['role'] == 'assistant' %}" + THINK
             + "{%- endif %}{{- m['content'] + '<|im_end|>\\n' }}{%- endfor %}" + GEN_PROMPT,
    "drop": "{%- for m in messages %}" + ROLE + "{%- if m['role'] == 'assistant' and loop.last %}" + THINK
            + "{%- endif %}{{- m['content'] + '<|im_end|>\\n' }}{%- endfor %}" + GEN_PROMPT,
}

WORDS = ("the of and to in is that for it as with was on be by this are from at or an which have not "
         "model token mask turn train draft target layer hidden state vector cache batch prefix "
         "δέλτα ünïcode naïve café 東京 数据 ✓ → ∑ 🙂 über straße").split()


def sentence(r, n):
    return " ".join(r.choice(WORDS) for _ in range(n)).capitalize() + r.choice([".", "?", "!", "…"])


def build(a):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:  # transformers 5 names the fast class TokenizersBackend
        from transformers import TokenizersBackend as PreTrainedTokenizerFast
    r = random.Random(1)
    corpus = [" ".join(sentence(r, r.randint(4, 30)) for _ in range(8)) for _ in range(4000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=3000, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    for name, template in TEMPLATES.items():
        hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
        hf.chat_template = template
        d = os.path.join(a.dir, name)
        hf.save_pretrained(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({"vocab_size": len(hf), "model_type": "llama"}, f)
    print(json.dumps({"tokenizers": sorted(TEMPLATES), "vocab_size": len(hf)}))


def convs(a):
    r = random.Random(a.seed)
    with open(a.path, "w") as f:
        for i in range(a.n):
            msgs = []
            if r.random() < 0.5:
                msgs.append({"role": "system", "content": sentence(r, r.randint(5, 20))})
            for _ in range(r.randint(1, 4)):
                msgs.append({"role": "user", "content": " ".join(sentence(r, r.randint(4, 25)) for _ in range(r.randint(1, 4)))})
                m = {"role": "assistant", "content": " ".join(sentence(r, r.randint(4, 25)) for _ in range(r.randint(2, 9)))}
                if r.random() < 0.4:
                    m["reasoning_content"] = " ".join(sentence(r, r.randint(4, 20)) for _ in range(r.randint(1, 4)))
                msgs.append(m)
            f.write(json.dumps({"id": f"c{i}", "messages": msgs}, ensure_ascii=False) + "\n")


def load_tok(path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def hf_encode(tok, messages):
    out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    return list(out["input_ids"]), list(out["assistant_masks"])


def check(a):
    tok = load_tok(a.tok)
    ref = load_tok(a.masks_from) if a.masks_from else tok
    by_id = {}
    with open(a.convs) as f:
        for line in f:
            c = json.loads(line)
            by_id[c["id"]] = c["messages"]
    n = ids_bad = mask_bad = 0
    first = None
    with open(a.prepared) as f:
        for line in f:
            rec = json.loads(line)
            msgs = by_id[rec["id"]]
            ids, mask = hf_encode(tok, msgs)
            if a.masks_from:  # a template without tags: the mask is the tagged twin's
                ref_ids, mask = hf_encode(ref, msgs)
                if ref_ids != ids:
                    raise SystemExit(f"{rec['id']}: the two templates render different tokens")
            n += 1
            if rec["input_ids"] != ids:
                ids_bad += 1
                first = first or {"id": rec["id"], "what": "input_ids"}
            elif rec["loss_mask"] != mask:
                mask_bad += 1
                if first is None:
                    d = [k for k in range(len(mask)) if mask[k] != rec["loss_mask"][k]]
                    first = {"id": rec["id"], "what": "loss_mask", "positions": d[:8],
                             "tokens": [tok.decode([ids[k]]) for k in d[:8]]}
    print(json.dumps({"checked": n, "input_ids_differ": ids_bad, "loss_mask_differs": mask_bad, "first_difference": first,
                      "ok": n > 0 and ids_bad == 0 and mask_bad == 0}, ensure_ascii=False))
    return 0 if n > 0 and ids_bad == 0 and mask_bad == 0 else 1


_tok = None


def _init(path):
    global _tok
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _tok = load_tok(path)


def _work(lines):
    tokens = 0
    for line in lines:
        ids, _ = hf_encode(_tok, json.loads(line)["messages"])
        tokens += len(ids)
    return tokens


def anchor(a):
    with open(a.convs) as f:
        lines = f.readlines()
    t0 = time.time()
    step = 64
    with mp.get_context("fork").Pool(a.procs, initializer=_init, initargs=(a.tok,)) as pool:
        tokens = sum(pool.imap_unordered(_work, [lines[i:i + step] for i in range(0, len(lines), step)]))
    dt = time.time() - t0
    print(json.dumps({"conversations": len(lines), "tokens": tokens, "seconds": round(dt, 3), "processes": a.procs,
                      "conversations_per_second": round(len(lines) / dt, 1), "tokens_per_conversation": round(tokens / len(lines), 1)}))


def workerstats(a):
    """The prepare workers' stats lines in an extract log (slog text), summed."""
    tot = {}
    for line in open(a.log):
        if "prepare worker stats" not in line:
            continue
        m = re.search(r' stats=("(?:[^"\\]|\\.)*")', line)
        for k, v in json.loads(json.loads(m.group(1))).items():
            tot[k] = round(tot.get(k, 0) + v, 2)
    print(json.dumps(tot))


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("build"); p.add_argument("dir")
    p = sub.add_parser("convs"); p.add_argument("path"); p.add_argument("n", type=int); p.add_argument("--seed", type=int, default=7)
    p = sub.add_parser("check"); p.add_argument("tok"); p.add_argument("convs"); p.add_argument("prepared"); p.add_argument("--masks-from")
    p = sub.add_parser("anchor"); p.add_argument("tok"); p.add_argument("convs"); p.add_argument("procs", type=int)
    p = sub.add_parser("workerstats"); p.add_argument("log")
    a = ap.parse_args()
    return {"build": build, "convs": convs, "check": check, "anchor": anchor, "workerstats": workerstats}[a.cmd](a) or 0


if __name__ == "__main__":
    sys.exit(main())
