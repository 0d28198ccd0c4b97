#!/usr/bin/env bash
# extract prepare with real Hugging Face tokenizers (transformers 5, tokenizers), on the
# device machine (no GPU needed for prepare; step 3 uses one). No network.
# Needs: python3 with transformers and tokenizers, and a prebuilt extract (DEVICE_EXTRACT_BIN,
# default .devbin/extract: `go build -o .devbin/extract ./cmd/extract` where Go is).
#
#   1. A byte-level BPE trained here, saved with save_pretrained three times: tags/ (a
#      template with {% generation %} blocks), plain/ (the same text without), drop/
#      (reasoning only in the last assistant turn, as Qwen3's template does).
#   2. 2000 conversations: system turns, 1-4 turns, reasoning_content on 40% of the
#      assistant turns. extract prepare on each tokenizer:
#        tags (mask auto = tags): ids and masks equal apply_chat_template(...,
#          return_assistant_tokens_mask=True)
#        tags with prepare.mask: prefix, and plain (auto = prefix): the token-prefix
#          method agrees with the tags' masks
#        drop: every conversation whose earlier turn has reasoning is refused
#          (not_a_token_prefix), the others agree
#   3. the prepared dataset through server.kind transformers (a tiny random Llama of the
#      tokenizer's vocabulary) to output.format specforge files, loaded by torch and, with
#      SPECFORGE_SRC (default .specforge, a copy of ../shared/specforge-src carried along),
#      SpecForge's own reader; the vocabulary file checked against SpecForge's function.
#   --bench-only: step 1 and the bench alone (BENCH_NAMES: which of "tags plain").
#   --bench: prepare vs the anchor (HF's apply_chat_template with masks, one process per
#      core) over the same 40000 conversations, both end to end, tags and prefix.
# Prints one summary at the end (also $OUT/prepare-summary.txt); exit 0 only if every
# check passed.
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
-h | --help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
"" | --bench | --bench-only) ;;
*) echo "device_prepare.sh: takes only --bench or --bench-only, got $1 (see --help)" >&2; exit 2 ;;
esac
BIN=$(realpath "${DEVICE_EXTRACT_BIN:-.devbin/extract}")
HELP=$(realpath scripts/device_prepare.py)
SF=${SPECFORGE_SRC:-$PWD/.specforge}
W=${DEVRUN_DIR:-$PWD/.devrun/prepare}
BENCH=0; [ "${1:-}" = "--bench" ] && BENCH=1
ONLY=0; [ "${1:-}" = "--bench-only" ] && BENCH=1 && ONLY=1
rm -rf "$W"; mkdir -p "$W"
SUMMARY=$W/summary.txt; : >"$SUMMARY"
FAIL=0
say() { echo "$*" | tee -a "$SUMMARY"; }
CORES=$(nproc)
say "host: $CORES cores; $(python3 -c 'import transformers, tokenizers, sys; print("python", sys.version.split()[0], "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)')"

# cfg NAME TOKDIR [PREPARE_KEY_LINE...]: a config for prepare (and doctor) only
cfg() {
  local name=$1 tok=$2; shift 2
  {
    printf 'dataset: %s\noutput_dir: %s\nshm_dir: /dev/shm/extract-prep-%s\n' "$W/convs.jsonl" "$W/$name-out" "$name"
    printf 'server:\n  kind: transformers\n  model_path: %s\n  python: python3\n  num_layers: 4\n  hidden_size: 256\n  layers: [1, 2, 3]\n  gpus: [0]\n' "$tok"
    printf 'prepare:\n  workers: %s\n' "$CORES"
    for kv in "$@"; do printf '  %s\n' "$kv"; done
  } >"$W/$name.yaml"
}

prep() { # prep NAME: extract prepare into $W/NAME-prep
  if ! "$BIN" prepare --config "$W/$1.yaml" --to "$W/$1-prep" --json >"$W/$1-prep.json" 2>"$W/$1-prep.log"; then
    say "FAIL $1: extract prepare failed"; tail -20 "$W/$1-prep.log" | tee -a "$SUMMARY"; FAIL=1; return 1
  fi
  python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['counts']; print(sys.argv[2], 'accepted', s['accepted'], 'refused', s.get('refused') or {})" "$W/$1-prep.json" "$1" | tee -a "$SUMMARY"
}

check() { # check NAME TOKDIR [--masks-from DIR]
  local out; out=$(python3 "$HELP" check "$2" "$W/convs.jsonl" "$W/$1-prep/dataset.jsonl" "${@:3}" 2>&1)
  say "check $1: $out"
  echo "$out" | grep -q '"ok": true' || FAIL=1
}

python3 "$HELP" build "$W/tok" | tee -a "$SUMMARY" || exit 1
python3 "$HELP" convs "$W/convs.jsonl" 2000

if [ $ONLY = 1 ]; then
  cfg tags "$W/tok/tags"; cfg plain "$W/tok/plain"
else
cfg tags "$W/tok/tags"; prep tags && check tags "$W/tok/tags"
cfg tagsprefix "$W/tok/tags" "mask: prefix"; prep tagsprefix && check tagsprefix "$W/tok/tags"
cfg plain "$W/tok/plain"; prep plain && check plain "$W/tok/plain" --masks-from "$W/tok/tags"
cfg drop "$W/tok/drop"; prep drop && check drop "$W/tok/drop" --masks-from "$W/tok/tags"
want_drop=$(python3 -c "
import json, sys
n = 0
for l in open(sys.argv[1]):
    a = [m for m in json.loads(l)['messages'] if m['role'] == 'assistant']
    n += any(m.get('reasoning_content') for m in a[:-1])
print(n)" "$W/convs.jsonl")
got_drop=$(python3 -c "import json,sys; print((json.load(open(sys.argv[1]))['counts'].get('refused') or {}).get('not_a_token_prefix', 0))" "$W/drop-prep.json" 2>/dev/null)
say "drop: refused not_a_token_prefix $got_drop, conversations with reasoning before their last turn $want_drop"
[ "$got_drop" = "$want_drop" ] || FAIL=1
"$BIN" prepare --config "$W/tags.yaml" --show 1 >"$W/show.txt" 2>&1 && head -c 1500 "$W/show.txt" | sed 's/^/show: /' | tee -a "$SUMMARY"
"$BIN" doctor --config "$W/tags.yaml" --json >"$W/doctor.json" 2>/dev/null
say "doctor tokenizer check: $(python3 -c "import json,sys; print([c for c in json.load(open(sys.argv[1]))['checks'] if c['name']=='tokenizer'])" "$W/doctor.json" 2>&1)"

# 3. the prepared dataset through server.kind transformers into SpecForge's files.
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  V=$(python3 -c "import json; print(json.load(open('$W/tok/tags/config.json'))['vocab_size'])")
  python3 scripts/device_transformers.py make-model "$W/model" --layers 4 --hidden 256 --intermediate 512 --heads 4 --vocab "$V" >>"$SUMMARY" || FAIL=1
  mkdir -p /dev/shm/extract-prep-run
  {
    printf 'dataset: %s\noutput_dir: %s\nshm_dir: /dev/shm/extract-prep-run\n' "$W/convs.jsonl" "$W/run-out"
    printf 'server:\n  kind: transformers\n  model_path: %s\n  python: python3\n  num_layers: 4\n  hidden_size: 256\n  layers: [1, 2, 3]\n  gpus: [0]\n  port: 30177\n  startup_timeout: 5m\n' "$W/model"
    printf 'prepare:\n  tokenizer: %s\n  workers: %s\nvocab:\n  draft_size: 512\noutput:\n  format: specforge\nrun:\n  max_inflight: 64\nstatus:\n  listen: 127.0.0.1:0\n' "$W/tok/tags" "$CORES"
  } >"$W/run.yaml"
  if "$BIN" run --config "$W/run.yaml" >"$W/run.log" 2>&1; then
    say "run: $(grep -c . "$W/run-out/.extract/prepare/dataset.jsonl") samples prepared, $(find "$W/run-out" -name 'data_*.ckpt' | wc -l) SpecForge files"
    "$BIN" export --config "$W/run.yaml" --format safetensors --to "$W/run-ref" >/dev/null 2>&1
    args=("$W/run-out" --reference "$W/run-ref")
    [ -d "$SF/specforge" ] && args+=(--specforge "$SF" --collate 8)
    out=$(python3 scripts/check_torch_formats.py "${args[@]}" 2>&1 | python3 -c "import json,sys; t=sys.stdin.read(); i=t.find('{'); print(json.dumps(json.loads(t[i:])) if i >= 0 else t)")
    say "torch/SpecForge read: $out"
    echo "$out" | grep -q '"ok": true' || FAIL=1
    if [ -d "$SF/specforge" ]; then
      out=$(python3 scripts/check_vocab_mapping.py "$W/run-out/vocab_mapping" --samples "$W/run-out/.extract/prepare/dataset.jsonl" --draft 512 --target "$V" --specforge "$SF" 2>&1)
      say "vocab vs SpecForge: $out"; echo "$out" | grep -q '"ok": true' || FAIL=1
    else
      say "vocab vs SpecForge: not run (no SpecForge source at $SF)"
    fi
  else
    say "FAIL run: $(tail -5 "$W/run.log")"; FAIL=1
  fi
else
  say "run through server.kind transformers: not run (no GPU)"
fi
fi # --bench-only

if [ $BENCH = 1 ]; then
  python3 "$HELP" convs "$W/bench.jsonl" 40000 --seed 11
  for name in ${BENCH_NAMES:-tags plain}; do
    sed "s#$W/convs.jsonl#$W/bench.jsonl#" "$W/$name.yaml" >"$W/bench-$name.yaml"
    t0=$(date +%s.%N)
    prof=(); [ -n "${OUT:-}" ] && prof=(env "EXTRACT_PROFILE_DIR=$OUT/profile-$name")
    "${prof[@]}" "$BIN" prepare --config "$W/bench-$name.yaml" --to "$W/bench-$name-prep" --json >"$W/bench-$name.json" 2>"$W/bench-$name.log" || FAIL=1
    t1=$(date +%s.%N)
    tokens=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['counts']['tokens'])" "$W/bench-$name-prep/manifest.json" 2>&1)
    say "bench prepare ($name, $CORES workers, $tokens tokens): $(python3 -c "print(round(40000/($t1-$t0), 1))") conversations/s, $(python3 -c "print(round($t1-$t0, 2))") s end to end"
    # Where the workers' time went (their stats lines in the log): summed over workers.
    say "bench prepare ($name) workers, summed: $(python3 "$HELP" workerstats "$W/bench-$name.log" 2>&1)"
  done
  say "bench anchor (HF apply_chat_template with masks, $CORES processes, end to end): $(python3 "$HELP" anchor "$W/tok/tags" "$W/bench.jsonl" "$CORES")"
fi

say "result: $([ $FAIL = 0 ] && echo PASS || echo FAIL)"
[ -n "${OUT:-}" ] && cp "$SUMMARY" "$OUT/prepare-summary.txt"
exit $FAIL
