"""Helpers of scripts/device_generate.sh (extract generate on server.kind transformers).

  build DIR                      a tiny random-weight Llama (float32) with a byte-level
                                 tokenizer and a ChatML template, built here, offline
  data FILE N                    N conversations, single- and two-turn (OpenAI form)
  check DIR CONVERSATIONS OUT    every sample's generated tokens equal model.generate's
                                 greedy tokens for the same prompt, turn by turn, and
                                 the loss mask is 1 exactly on them (+ a closing
                                 <|im_end|> after a reply cut at max_new_tokens)
"""

import json
import os
import sys

MAX_NEW = int(os.environ.get("GEN_MAX_NEW", "24"))
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def build(d):
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    os.makedirs(d, exist_ok=True)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|im_end|>",
                                                additional_special_tokens=["<|im_start|>"])
    fast.chat_template = CHATML
    fast.save_pretrained(d)
    im_end = fast.convert_tokens_to_ids("<|im_end|>")
    cfg = transformers.LlamaConfig(vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096,
                                   tie_word_embeddings=False, eos_token_id=im_end, bos_token_id=im_end, pad_token_id=im_end)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    model.generation_config = transformers.GenerationConfig(eos_token_id=im_end, pad_token_id=im_end)
    model.save_pretrained(d)
    print(json.dumps({"model": d, "vocab": len(fast), "im_end": im_end}))


def data(path, n):
    import random

    rng = random.Random(3)
    words = ["alpha", "beta", "gamma", "delta", "tokens", "draft", "target", "turn"]
    with open(path, "w") as f:
        for i in range(n):
            msgs = []
            for _ in range(1 + (i % 4 == 3)):
                msgs.append({"role": "user", "content": " ".join(rng.choice(words) for _ in range(rng.randint(2, 12)))})
                msgs.append({"role": "assistant", "content": "old"})
            f.write(json.dumps({"id": f"c{i}", "messages": msgs}) + "\n")


def check(d, convs, out):
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sglang", "hfserver"))
    from extract_hfserver import backend
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(d, local_files_only=True)
    model = backend.load_transformers(d, backend.Options(dtype="float32")).model
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    dev = next(model.parameters()).device
    lines = [json.loads(l) for l in open(out)]
    src = [json.loads(l) for l in open(convs)]
    bad, turns, gen_tokens = 0, 0, 0
    if len(lines) != len(src):
        print(json.dumps({"ok": False, "error": f"{len(lines)} output lines for {len(src)} conversations"}))
        return 1
    for s, l in zip(src, lines):
        ids, mask = l["input_ids"], l["loss_mask"]
        if l["id"] != s["id"]:
            bad += 1
            continue
        # Walk the sample: each assistant turn's prompt is the sample's prefix up to it.
        pos, hist = 0, []
        for m in l["messages"]:
            if m["role"] != "assistant":
                hist.append(m)
                continue
            if pos == 0:
                # The first prompt is the template's, encoded whole.
                prompt = list(tok.apply_chat_template(hist, add_generation_prompt=True, tokenize=True, return_dict=False))
                if ids[:len(prompt)] != prompt:
                    bad += 1
                    print("prompt differs", l["id"], ids[:len(prompt)], prompt, file=sys.stderr)
                    break
            # The prefix the server saw: the sample up to the generation prompt of this turn.
            at = find_prompt_end(ids, mask, pos)
            x = torch.tensor([ids[:at]], device=dev)
            with torch.inference_mode():
                y = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=MAX_NEW,
                                   eos_token_id=im_end, pad_token_id=im_end)
            want = y[0, at:].tolist()
            got = ids[at:at + len(want)]
            turns += 1
            gen_tokens += len(want)
            if got != want or any(v != 1 for v in mask[at:at + len(want)]) or any(v != 0 for v in mask[:at][pos:]):
                bad += 1
                print("turn differs", l["id"], got, want, file=sys.stderr)
                break
            pos = at + len(want)
            if not want or want[-1] != im_end:
                pos += 1  # the template's closing <|im_end|> of a reply cut short, in the loss
            hist.append(m)
    print(json.dumps({"ok": bad == 0, "conversations": len(lines), "turns": turns, "generated_tokens": gen_tokens, "bad": bad}))
    return 0 if bad == 0 else 1


def find_prompt_end(ids, mask, pos):
    """The first masked position at or after pos: where the generated tokens begin."""
    for i in range(pos, len(mask)):
        if mask[i] == 1:
            return i
    return len(ids)


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd in ("-h", "--help"):
        print(__doc__)
        sys.exit(0)
    want = {"build": 3, "data": 4, "check": 5}
    if cmd not in want or len(sys.argv) != want[cmd]:
        print(f"device_generate.py: unknown command or arguments {sys.argv[1:]} (see --help)", file=sys.stderr)
        sys.exit(2)
    if cmd == "build":
        build(sys.argv[2])
    elif cmd == "data":
        data(sys.argv[2], int(sys.argv[3]))
    elif cmd == "check":
        sys.exit(check(sys.argv[2], sys.argv[3], sys.argv[4]))
