#!/usr/bin/env bash
# extract generate on server.kind transformers with a real (random-weight) model on a
# GPU: a 4-layer Llama (float32) with a byte-level tokenizer and a ChatML template,
# built here offline. Checks that every sample's generated tokens are model.generate's
# greedy tokens for the same prompt (the sample's prefix up to that turn), that a
# SIGKILLed generate resumes to the same file, and prints conversations/s and tokens/s.
# Needs: an NVIDIA GPU, python3 with torch, transformers, tokenizers and jinja2, and a
# prebuilt extract in DEVICE_EXTRACT_BIN (default .devbin/extract; not EXTRACT_*: the
# binary refuses EXTRACT_ variables that name no config key). No network.
#
#   go build -o .devbin/extract ./cmd/extract && bash scripts/device_generate.sh
set -uo pipefail
case "${1:-}" in
"") ;;
-h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
*) echo "device_generate.sh: takes no arguments, got $1 (see --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
BIN=$(realpath "${DEVICE_EXTRACT_BIN:-.devbin/extract}")
HELP=$(realpath scripts/device_generate.py)
W=${DEVRUN_DIR:-$PWD/.devrun-generate}
N=${GEN_CONVERSATIONS:-256}
export GEN_MAX_NEW=${GEN_MAX_NEW:-24}
rm -rf "$W"; mkdir -p "$W" /dev/shm/extract-devgen
export EXTRACT_LOG_LEVEL=info
FAIL=0
python3 "$HELP" build "$W/model" || exit 1
python3 "$HELP" data "$W/conversations.jsonl" "$N" || exit 1
cat >"$W/job.yaml" <<YAML
dataset: $W/conversations.jsonl
output_dir: $W/out
shm_dir: /dev/shm/extract-devgen
server:
  kind: transformers
  model_path: $W/model
  python: python3
  num_layers: 4
  hidden_size: 128
  layers: [1, 2, 3]
  gpus: [0]
  port: 30977
  startup_timeout: 5m
  transformers:
    dtype: float32
prepare:
  workers: 2
generate:
  temperature: 0
  max_new_tokens: $GEN_MAX_NEW
  max_inflight: 16
  on_empty: keep
  on_only_stop: keep
YAML
# A kill mid-way, then a resume to the end.
timeout -s KILL 20 "$BIN" generate --config "$W/job.yaml" --to "$W/generated.jsonl" 2>"$W/gen1.log"
echo "first generate (killed after 20 s or finished): rc=$?"
T0=$(date +%s.%N)
"$BIN" generate --config "$W/job.yaml" --to "$W/generated.jsonl" --resume --json >"$W/summary.json" 2>"$W/gen2.log" || { echo "generate --resume failed"; tail -20 "$W/gen2.log"; exit 1; }
T1=$(date +%s.%N)
cat "$W/summary.json"
"$BIN" generate --config "$W/job.yaml" --report | head -12
python3 "$HELP" check "$W/model" "$W/conversations.jsonl" "$W/generated.jsonl" || FAIL=1
# The rate of a whole uninterrupted generate.
"$BIN" generate --config "$W/job.yaml" --to "$W/generated2.jsonl" --fresh --json >"$W/summary2.json" 2>"$W/gen3.log" || FAIL=1
python3 - "$W/summary2.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
sec = s["elapsed_ns"] / 1e9
print(json.dumps({"figure": "generate on transformers, uninterrupted", "conversations": s["total"], "seconds": round(sec, 2),
                  "conversations_per_second": round(s["total"] / sec, 2), "tokens_per_second": round(s["generated_tokens"] / sec, 1)}))
PY
cmp -s "$W/generated.jsonl" "$W/generated2.jsonl" && echo "resumed and uninterrupted outputs are identical" || { echo "resumed and uninterrupted outputs differ"; FAIL=1; }
echo "device_generate: $([ $FAIL -eq 0 ] && echo PASS || echo FAIL)"
exit $FAIL
