#!/usr/bin/env bash
# server.kind transformers on a real GPU with real (randomly initialised) models, end to
# end through the extract binary. Needs: an NVIDIA GPU, python3 with torch, transformers
# and safetensors, and a prebuilt extract (DEVRUN_BIN, default .devbin/extract; build it
# with `go build -o .devbin/extract ./cmd/extract` where Go is). No network.
#
#   (a) a 4-layer Llama (hidden 256, fixed seed): one request a forward, every output bit
#       for bit equal to model(input_ids, output_hidden_states=True); then batched, every
#       output bit for bit equal to an offline replay of its batch.
#   (b) an 8-layer Llama, hidden 4096 (~3.2 GB of bf16 weights), 512 samples: throughput
#       of an uninterrupted run next to the GPU's forward-only rate; then a run whose
#       server is SIGKILLed, whose orchestrator is SIGKILLed, `extract doctor` naming our
#       server's pid on the GPU as ours, a resume, and every output checked.
# Prints one summary at the end; exit 0 only if every check passed.
set -uo pipefail
case "${1:-}" in
-h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
-*) echo "device_transformers.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
BIN=$(realpath "${DEVRUN_BIN:-.devbin/extract}")
HELP=$(realpath scripts/device_transformers.py)
W=${DEVRUN_DIR:-$PWD/.devrun}
SHM=/dev/shm/extract-devrun
rm -rf "$W" "$SHM"; mkdir -p "$W" "$SHM"
export EXTRACT_LOG_LEVEL=info
SUMMARY=$W/summary.txt; : >"$SUMMARY"
FAIL=0
say() { echo "$*" | tee -a "$SUMMARY"; }
now() { date +%s.%N; }
outputs() { find "$1" -name 'data_*.safetensors' 2>/dev/null | wc -l; }
T0=$(now)

# config NAME MODEL LAYERS HIDDEN CAPTURE MAX_TOKENS MAX_REQUESTS PORT: writes $W/NAME.yaml
config() {
  mkdir -p "$SHM/$1"
  cat >"$W/$1.yaml" <<EOF
dataset: $W/$1.jsonl
output_dir: $W/$1-out
shm_dir: $SHM/$1
server:
  kind: transformers
  model_path: $2
  python: python3
  num_layers: $3
  hidden_size: $4
  layers: [$5]
  gpus: [0]
  port: $8
  startup_timeout: 5m
  health_interval: 5s
  transformers:
    max_batch_tokens: $6
    max_batch_requests: $7
run:
  max_inflight: 64
  movers: 4
disk:
  reserve: 1GiB
status:
  listen: 127.0.0.1:0
EOF
}

check() { # NAME MODEL MODE LAYERS -> appends the checker's JSON to the summary
  local out
  out=$(python3 "$HELP" check "$2" "$W/$1.jsonl" "$W/$1-out" "$W/$1-out/.extract/logs/server.log" --layers "$4" --mode "$3")
  local rc=$?
  say "check $1 ($3): $out"
  [ $rc -eq 0 ] || { FAIL=1; say "FAIL: $1 outputs do not match the offline reference"; }
}

run_job() { # NAME: extract run, exit code checked
  "$BIN" run --config "$W/$1.yaml" >"$W/$1.stdout" 2>"$W/$1.stderr"
  local rc=$?
  [ $rc -eq 0 ] || { FAIL=1; say "FAIL: extract run $1 exit $rc: $(tail -3 "$W/$1.stderr")"; }
}

say "== transformers on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); $(python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"

# ---- (a) tiny model: exact, then batched
python3 "$HELP" make-model "$W/tiny" --layers 4 --hidden 256 --intermediate 512 --heads 4 --vocab 1000 >>"$SUMMARY" || FAIL=1
python3 "$HELP" make-data "$W/a1.jsonl" --samples 64 --min-len 4 --max-len 200 --vocab 1000 >>"$SUMMARY"
cp "$W/a1.jsonl" "$W/a2.jsonl"
config a1 "$W/tiny" 4 256 "1, 2, 3" 4096 1 31101
config a2 "$W/tiny" 4 256 "1, 2, 3" 4096 16 31102
run_job a1; check a1 "$W/tiny" exact 1,2,3
run_job a2; check a2 "$W/tiny" batched 1,2,3

# ---- (b) 8 layers x 4096: throughput, then kills and resume
python3 "$HELP" make-model "$W/big" --layers 8 --hidden 4096 --intermediate 8192 --heads 32 --vocab 32000 | tee -a "$SUMMARY" || FAIL=1
python3 "$HELP" make-data "$W/b0.jsonl" --samples 512 --min-len 32 --max-len 768 --vocab 32000 | tee -a "$SUMMARY"
TOKENS=$(python3 -c "import json,sys; print(sum(len(json.loads(l)['input_ids']) for l in open(sys.argv[1])))" "$W/b0.jsonl")
cp "$W/b0.jsonl" "$W/b1.jsonl"
config b0 "$W/big" 8 4096 "2, 4, 6" 16384 64 31103
config b1 "$W/big" 8 4096 "2, 4, 6" 16384 64 31104

start=$(now)
"$BIN" run --config "$W/b0.yaml" >"$W/b0.stdout" 2>"$W/b0.stderr" &
RUN=$!
first=""
while kill -0 $RUN 2>/dev/null; do
  if [ -z "$first" ] && [ "$(outputs "$W/b0-out")" -gt 0 ]; then first=$(now); fi
  sleep 0.05
done
wait $RUN; rc=$?
end=$(now)
[ $rc -eq 0 ] || { FAIL=1; say "FAIL: b0 exit $rc: $(tail -3 "$W/b0.stderr")"; }
BYTES=$(du -sb --exclude=.extract "$W/b0-out" | cut -f1)
python3 - "$start" "${first:-$start}" "$end" "$TOKENS" "$BYTES" <<'EOF' | tee -a "$SUMMARY"
import sys
start, first, end, tokens, nbytes = map(float, sys.argv[1:])
steady = max(end - first, 1e-9)
print(f"throughput b0: 512 samples, {int(tokens)} tokens, {nbytes/1e9:.2f} GB written; wall {end-start:.1f}s "
      f"(server start included); from first output to last {steady:.1f}s: {tokens/steady:,.0f} tok/s, {nbytes/1e9/steady:.2f} GB/s")
EOF
python3 "$HELP" forward-rate "$W/big" --tokens-per-batch 16384 --batches 10 | sed 's/^/forward-only: /' | tee -a "$SUMMARY"

# b1: SIGKILL the server at 100 outputs, the orchestrator at 250, doctor, resume.
"$BIN" run --config "$W/b1.yaml" >"$W/b1.stdout" 2>"$W/b1.stderr" &
RUN=$!
until [ "$(outputs "$W/b1-out")" -ge 100 ] || ! kill -0 $RUN 2>/dev/null; do sleep 0.02; done
SPID=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['pgid'])" "$W/b1-out/.extract/server.json")
kill -9 -- -"$SPID" && say "killed server group $SPID at $(outputs "$W/b1-out") outputs"
until [ "$(outputs "$W/b1-out")" -ge 250 ] || ! kill -0 $RUN 2>/dev/null; do sleep 0.02; done
if kill -9 $RUN 2>/dev/null; then say "killed orchestrator $RUN at $(outputs "$W/b1-out") outputs"; else FAIL=1; say "FAIL: b1 ended before the orchestrator kill"; fi
wait $RUN 2>/dev/null
SPID2=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['pid'])" "$W/b1-out/.extract/server.json")
[ "$SPID2" != "$SPID" ] || { FAIL=1; say "FAIL: no new server after the kill"; }
"$BIN" doctor --config "$W/b1.yaml" >"$W/doctor.txt" 2>&1
say "doctor (server $SPID2 alive, orchestrator dead): $(grep -E '^\S*\s*(gpu 0|cuda|torch|transformers|model|model config|gpu memory|hook)\b' "$W/doctor.txt" | tr '\n' '|' | cut -c1-900)"
grep -q "held by our server (pid $SPID2" "$W/doctor.txt" || { FAIL=1; say "FAIL: doctor does not name server pid $SPID2 on the GPU as ours (see $W/doctor.txt)"; }
"$BIN" run --resume --config "$W/b1.yaml" >"$W/b1-resume.stdout" 2>"$W/b1-resume.stderr" || { FAIL=1; say "FAIL: resume: $(tail -3 "$W/b1-resume.stderr")"; }
grep -q "adopting server" "$W/b1-out/.extract/logs/extract.log" "$W/b1-resume.stderr" && say "resume adopted server $SPID2"
say "status b1: $("$BIN" status --json --config "$W/b1.yaml" | tr -d '\n' | cut -c1-400)"
check b1 "$W/big" batched 2,4,6

say "== total $(python3 -c "print(round($(now) - $T0))")s; $([ $FAIL -eq 0 ] && echo PASS || echo FAIL)"
rm -rf "$SHM"
# The device tool brings back what is under $OUT: the summary, doctor's report, log tails.
if [ -n "${OUT:-}" ]; then
  cp "$SUMMARY" "$W/doctor.txt" "$OUT/" 2>/dev/null
  for j in a1 a2 b0 b1; do tail -c 200000 "$W/$j-out/.extract/logs/server.log" >"$OUT/$j-server.log" 2>/dev/null; done
  tail -c 200000 "$W/b1-out/.extract/logs/extract.log" >"$OUT/b1-extract.log" 2>/dev/null
fi
echo; echo "==== SUMMARY"; cat "$SUMMARY"
exit $FAIL
