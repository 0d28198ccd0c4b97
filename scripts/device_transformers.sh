#!/usr/bin/env bash
# server.kind transformers on a real GPU with real (randomly initialised) models, end to
# end through the extract binary. Needs: an NVIDIA GPU, python3 with torch, transformers
# and safetensors, and a prebuilt extract (DEVICE_EXTRACT_BIN, default .devbin/extract;
# not EXTRACT_*: the binary refuses EXTRACT_ variables that name no config key; build it
# with `go build -o .devbin/extract ./cmd/extract` where Go is). No network.
#
#   bash scripts/device_transformers.sh [exact|perf|all|variants|tmpfs]     (default all)
#
# The two halves fit one 10-minute device call each; models are kept in $W/models
# between calls on one machine.
# exact:
#   (a) a 4-layer Llama (hidden 256, fixed seed): one request a forward, every output bit
#       for bit equal to model(input_ids, output_hidden_states=True); then batched, every
#       output bit for bit equal to an offline replay of its batch.
#   (b1) an 8-layer Llama, hidden 4096 (~3.2 GB of bf16 weights), 512 samples: a run whose
#       server is SIGKILLed, whose orchestrator is SIGKILLed, `extract doctor` naming our
#       server's pid on the GPU as ours, a resume, and every output checked.
# perf, for (b) and for (c), a 4-layer Llama at hidden 7168 (Kimi's width):
#   the whole job with the output on the disk and on a tmpfs, the forward-only rate of the
#   same batches, cp + sync of the same bytes on the same disk, and the ratios against the
#   targets (whole job >= 0.9 x min(forward, disk); on the tmpfs >= 0.9 x forward).
# variants: (b)'s tmpfs run under each setting in VARIANTS (';'-separated SERVER_ARGS).
# tmpfs: the tmpfs targets alone: forward-only (b) and (c), (b)'s tmpfs run under each
#   of VARIANTS, (c)'s under each C_VARIANTS entry J[:MOVERS[:huge]] (default 1: the first
#   of VARIANTS, run.movers MOVERS, the output in /dev/shm), then 256 samples of (b)
#   checked batched and (a)'s two checks, all under the first variant. PARTS picks
#   which of "b c checks" run (default all three); C_SAMPLES is (c)'s sample count
#   (default 1536: 48 batches, 7 s from the first output to the last; at 384 the window
#   was 2 s and the pipeline's fill and drain weighed on it). Where b or c runs, it
#   first writes and removes files filling three quarters of the free memory (the least
#   of /dev/shm's, the memory's and a cgroup limit's), so that the runs' tmpfs pages are
#   ones this VM has touched before (TOUCH=0 skips it): on a fresh machine the first
#   run's dump writes were slow without it (docs/performance.md, round 4).
# Every run: MAX_INFLIGHT is run.max_inflight (default 384: the server's window of 256
#   plus what its pipeline holds), MOVERS run.movers (default 8).
# Prints one summary at the end; exit 0 only if every check passed.
set -uo pipefail
case "${1:-}" in
-h | --help) sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
"" | all | exact | perf | variants | tmpfs) ;;
*) echo "device_transformers.sh: the mode is all, exact, perf, variants or tmpfs, got $1 (see --help)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
MODE=${1:-all}
BIN=$(realpath "${DEVICE_EXTRACT_BIN:-.devbin/extract}")
HELP=$(realpath scripts/device_transformers.py)
W=${DEVRUN_DIR:-$PWD/.devrun}
SHM=/dev/shm/extract-devrun
TMPOUT=/dev/shm/extract-devrun-out
mkdir -p "$W/models"
find "$W" -mindepth 1 -maxdepth 1 ! -name models -exec rm -rf {} +
rm -rf "$SHM" "$TMPOUT"; mkdir -p "$SHM" "$TMPOUT"
export EXTRACT_LOG_LEVEL=info
SUMMARY=$W/summary.txt; : >"$SUMMARY"
FAIL=0
WINDOW=256 # the server's --window-requests: how many queued requests it sorts by length at once
# run.max_inflight: the window plus two batches of max_batch_requests 64, what a
# transformers job defaults to (configs.InflightToFill). The server answers a request
# once its dump is written, so with run.max_inflight equal to the window, the windows
# held only what the batches still being written left, and padded more
# (docs/performance.md, round 4). Written out so every run here says what it used.
MAX_INFLIGHT=${MAX_INFLIGHT:-$((WINDOW + 128))}
# More server flags, as YAML list items: SERVER_ARGS=', "--writers", "16"'
# run.movers of every run: MOVERS=8
SERVER_ARGS=${SERVER_ARGS:-}
say() { echo "$*" | tee -a "$SUMMARY"; }
now() { date +%s.%N; }
outputs() { find "$1" -name 'data_*.safetensors' 2>/dev/null | wc -l; }
T0=$(now)

# config NAME MODEL LAYERS HIDDEN CAPTURE MAX_TOKENS MAX_REQUESTS PORT [OUTPUT_DIR]: writes $W/NAME.yaml
config() {
  mkdir -p "$SHM/$1"
  cat >"$W/$1.yaml" <<EOF
dataset: $W/$1.jsonl
output_dir: ${9:-$W/$1-out}
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
  extra_args: ["--window-requests", "$WINDOW"$SERVER_ARGS]
  transformers:
    max_batch_tokens: $6
    max_batch_requests: $7
run:
  max_inflight: $MAX_INFLIGHT
  movers: ${MOVERS:-8}
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

model() { # NAME ARGS...: makes $W/models/NAME once
  [ -f "$W/models/$1/config.json" ] || python3 "$HELP" make-model "$W/models/$1" "${@:2}" | tee -a "$SUMMARY" || FAIL=1
}

# timed NAME OUTPUT_DIR SAMPLES: one uninterrupted run; appends "NAME tok/s GB/s" to $W/rates
timed() {
  local start first="" end rc
  start=$(now)
  "$BIN" run --config "$W/$1.yaml" >"$W/$1.stdout" 2>"$W/$1.stderr" &
  local run=$!
  local last=""
  while kill -0 $run 2>/dev/null; do
    local n
    n=$(outputs "$2")
    if [ -z "$first" ] && [ "$n" -gt 0 ]; then first=$(now); fi
    # The last output, not the exit: stopping the server and closing the index come after.
    if [ -z "$last" ] && [ "$n" -ge "$3" ]; then last=$(now); fi
    sleep 0.05
  done
  wait $run; rc=$?
  end=${last:-$(now)}
  [ $rc -eq 0 ] || { FAIL=1; say "FAIL: $1 exit $rc: $(tail -3 "$W/$1.stderr")"; }
  [ "$(outputs "$2")" -eq "$3" ] || { FAIL=1; say "FAIL: $1 wrote $(outputs "$2") outputs, want $3"; }
  local tokens bytes
  tokens=$(python3 -c "import json,sys; print(sum(len(json.loads(l)['input_ids']) for l in open(sys.argv[1])))" "$W/$1.jsonl")
  bytes=$(du -sb --exclude=.extract "$2" | cut -f1)
  python3 - "$1" "$start" "${first:-$start}" "$end" "$tokens" "$bytes" <<'EOF' | tee -a "$W/rates" | cut -d' ' -f4- | tee -a "$SUMMARY"
import sys
name = sys.argv[1]
start, first, end, tokens, nbytes = map(float, sys.argv[2:])
steady = max(end - first, 1e-9)
print(f"{name} {tokens/steady:.0f} {nbytes/steady:.0f} throughput {name}: {int(tokens)} tokens, {nbytes/1e9:.2f} GB written; from the start to the last output {end-start:.1f}s "
      f"(server start included); first output to last {steady:.2f}s: {tokens/steady:,.0f} tok/s, {nbytes/1e9/steady:.2f} GB/s")
EOF
}

# disk_rate NAME SRC: cp + sync of SRC's outputs to a new dir on the same disk
disk_rate() {
  sync
  local dst="$W/$1-cp" t0 t1 bytes
  t0=$(now)
  mkdir -p "$dst" && cp -r "$2"/rows_* "$dst/" && sync
  t1=$(now)
  bytes=$(du -sb "$dst" | cut -f1)
  python3 -c "import sys; b,t=float(sys.argv[3]),float(sys.argv[2])-float(sys.argv[1]); print(f'{sys.argv[4]} {b/t:.0f} cp + sync {sys.argv[4]}: {b/1e9:.2f} GB in {t:.2f}s: {b/1e9/t:.2f} GB/s')" "$t0" "$t1" "$bytes" "$1" | tee -a "$W/rates" | cut -d' ' -f3- | tee -a "$SUMMARY"
  rm -rf "$dst"
}

# perf NAME MODEL LAYERS HIDDEN CAPTURE SAMPLES MAX_TOKENS PORT: disk run, tmpfs run, forward, cp
perf() {
  local n=$1
  cp "$W/$n.jsonl" "$W/${n}t.jsonl"
  config "$n" "$W/models/$2" "$3" "$4" "$5" "$7" 64 "$8"
  config "${n}t" "$W/models/$2" "$3" "$4" "$5" "$7" 64 $(($8 + 1)) "$TMPOUT/${n}t"
  timed "$n" "$W/$n-out" "$6"
  disk_rate "$n-disk" "$W/$n-out"
  timed "${n}t" "$TMPOUT/${n}t" "$6"
  cp "$TMPOUT/${n}t/.extract/logs/server.log" "$W/${n}t-server.log" 2>/dev/null
  rm -rf "$TMPOUT/${n}t"
  python3 "$HELP" forward-rate "$W/models/$2" "$W/$n.jsonl" --layers "$(echo "$5" | tr -d ' ')" --max-batch-tokens "$7" --max-batch-requests 64 --window "$WINDOW" \
    | tail -1 | tee "$W/$n-forward.json" | sed "s/^/forward-only $n: /" | tee -a "$SUMMARY"
  python3 - "$W/rates" "$W/$n-forward.json" "$n" <<'EOF' | tee -a "$SUMMARY"
import json, sys
rates = {l.split()[0]: l.split()[1:3] for l in open(sys.argv[1]) if l.strip()}
fwd = json.load(open(sys.argv[2]))["forward_tokens_per_second"]
n = sys.argv[3]
tok, byt = map(float, rates[n])
tok_t = float(rates[n + "t"][0])
disk = float(rates[n + "-disk"][0])
per_token = byt / tok
limit = min(fwd * per_token, disk)
r_disk, r_tmp = byt / limit, tok_t / fwd
ok = r_disk >= 0.9 and r_tmp >= 0.9
print(f"targets {n}: disk run {byt/1e9:.2f} GB/s = {r_disk:.2f}x min(forward {fwd*per_token/1e9:.2f} GB/s, cp+sync {disk/1e9:.2f} GB/s) "
      f"(want >= 0.9); tmpfs run {tok_t:,.0f} tok/s = {r_tmp:.2f}x forward-only {fwd:,.0f} tok/s (want >= 0.9): {'MET' if ok else 'MISSED'}")
EOF
}

say "== transformers on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); $(python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'); mode $MODE; $(nproc) CPUs; disk: $(df -h "$W" | tail -1 | tr -s ' ')"

if [ "$MODE" = exact ] || [ "$MODE" = all ]; then
  # ---- (a) tiny model: exact, then batched
  model tiny --layers 4 --hidden 256 --intermediate 512 --heads 4 --vocab 1000
  python3 "$HELP" make-data "$W/a1.jsonl" --samples 64 --min-len 4 --max-len 200 --vocab 1000 >>"$SUMMARY"
  cp "$W/a1.jsonl" "$W/a2.jsonl"
  config a1 "$W/models/tiny" 4 256 "1, 2, 3" 4096 1 31101
  config a2 "$W/models/tiny" 4 256 "1, 2, 3" 4096 16 31102
  run_job a1
  # A broken server breaks every run after this one: stop here and show why.
  [ $FAIL -eq 0 ] || { tail -40 "$W/a1-out/.extract/logs/server.log"; cat "$SUMMARY"; exit 1; }
  check a1 "$W/models/tiny" exact 1,2,3
  run_job a2; check a2 "$W/models/tiny" batched 1,2,3

  # ---- (b1) 8 layers x 4096: SIGKILL the server at 100 outputs, the orchestrator at 250, doctor, resume.
  model big --layers 8 --hidden 4096 --intermediate 8192 --heads 32 --vocab 32000
  python3 "$HELP" make-data "$W/b1.jsonl" --samples 512 --min-len 32 --max-len 768 --vocab 32000 | tee -a "$SUMMARY"
  config b1 "$W/models/big" 8 4096 "2, 4, 6" 16384 64 31104
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
  check b1 "$W/models/big" batched 2,4,6
fi

if [ "$MODE" = variants ]; then
  # The tmpfs run of (b) under each server setting in VARIANTS (';'-separated SERVER_ARGS).
  model big --layers 8 --hidden 4096 --intermediate 8192 --heads 32 --vocab 32000
  python3 "$HELP" make-data "$W/v.jsonl" --samples 1024 --min-len 32 --max-len 768 --vocab 32000 | tee -a "$SUMMARY"
  i=0
  IFS=';' read -ra VS <<<"${VARIANTS:-}"
  for v in "${VS[@]}"; do
    i=$((i + 1))
    cp "$W/v.jsonl" "$W/v$i.jsonl"
    SERVER_ARGS=$v config "v$i" "$W/models/big" 8 4096 "2, 4, 6" 16384 64 $((31200 + i)) "$TMPOUT/v$i"
    say "variant v$i: $v"
    timed "v$i" "$TMPOUT/v$i" 1024
    rm -rf "$TMPOUT/v$i"
  done
fi

if [ "$MODE" = tmpfs ]; then
  # The tmpfs targets alone, in one short call: the forward-only rate of (b) and (c), the
  # tmpfs run of (b) under each server setting in VARIANTS (';'-separated SERVER_ARGS,
  # the first one also run on (c)), then a batched exactness check of 256 samples of (b)
  # under that first setting, and (a)'s two checks. The summary goes to $OUT as it grows.
  keep() { [ -n "${OUT:-}" ] && cp "$SUMMARY" "$OUT/" 2>/dev/null; true; }
  # touch_memory: 16 writers fill three quarters of what /dev/shm, the memory and this
  # cgroup's limit have free, then the files go, also when the script is stopped meanwhile.
  touch_memory() {
    local shm mem lim mib per t0 i wrote
    shm=$(df -m --output=avail /dev/shm | tail -1)
    mem=$(awk '/MemAvailable/ {print int($2 / 1024)}' /proc/meminfo)
    mib=$((shm < mem ? shm : mem))
    lim=$(cat /sys/fs/cgroup/memory.max 2>/dev/null || echo max)
    if [ "$lim" != max ] && [ -r /sys/fs/cgroup/memory.current ]; then
      lim=$(((lim - $(cat /sys/fs/cgroup/memory.current)) / 1048576))
      mib=$((lim < mib ? lim : mib))
    fi
    per=$((mib * 3 / 4 / 16)); t0=$(now)
    [ "$per" -gt 0 ] || { say "touched no memory: $mib MiB free"; return; }
    untouch() { kill $(jobs -p) 2>/dev/null; wait; rm -f "$SHM"/touch*; }
    trap untouch EXIT; trap 'untouch; exit 130' INT; trap 'untouch; exit 143' TERM
    for i in $(seq 16); do dd if=/dev/zero of="$SHM/touch$i" bs=1M count=$per status=none & done
    wait
    wrote=$(du -cm "$SHM"/touch* 2>/dev/null | tail -1 | cut -f1)
    untouch; trap - EXIT INT TERM
    say "touched ${wrote:-0} MiB of tmpfs memory (of $((per * 16)) asked) in $(python3 -c "print(round($(now) - $t0, 1))")s"
  }
  PARTS=${PARTS:-b c checks}
  if [ "${TOUCH:-1}" != 0 ] && [[ " $PARTS " == *" b "* || " $PARTS " == *" c "* ]]; then touch_memory; fi
  # tmpfs_run NAME MODEL LAYERS HIDDEN CAPTURE SAMPLES PORT ARGS: the run, its server's batch times, the ratio
  tmpfs_run() {
    SERVER_ARGS=$8 config "$1" "$W/models/$2" "$3" "$4" "$5" 16384 64 "$7" "$TMPOUT/$1"
    say "variant $1: ${8:-defaults}"
    timed "$1" "$TMPOUT/$1" "$6"
    python3 - "$TMPOUT/$1/.extract/logs/server.log" "$W/rates" "$W/${1%%v*}-forward.json" "$1" <<'EOF2' | tee -a "$SUMMARY"
import json, re, sys
b = [(float(m[0]), float(m[1])) for m in re.findall(r"batch \d+: width \d+ rids \S+ ms ([\d.]+) wait ([\d.]+)", open(sys.argv[1]).read())]
rate = float({l.split()[0]: l.split()[1] for l in open(sys.argv[2]) if l.strip()}[sys.argv[4]])
fwd = json.load(open(sys.argv[3]))["forward_tokens_per_second"]
print(f"  {sys.argv[4]}: {len(b)} batches, forward thread {sum(x for x, _ in b)/max(len(b),1):.1f} ms a batch, waiting for a host buffer {sum(y for _, y in b)/max(len(b),1):.1f} ms; "
      f"tmpfs {rate:,.0f} tok/s = {rate/fwd:.2f}x forward-only {fwd:,.0f} (want >= 0.9): {'MET' if rate >= 0.9*fwd else 'MISSED'}")
EOF2
    [ -n "${OUT:-}" ] && cp "$TMPOUT/$1/.extract/logs/server.log" "$OUT/$1-server.log" 2>/dev/null
    [ "${9:-}" = keep ] || rm -rf "$TMPOUT/$1"
    keep
  }
  fwd_rate() { # NAME MODEL CAPTURE
    python3 "$HELP" forward-rate "$W/models/$2" "$W/$1.jsonl" --layers "$3" --max-batch-tokens 16384 --max-batch-requests 64 --window "$WINDOW" \
      | tail -1 | tee "$W/$1-forward.json" | sed "s/^/forward-only $1: /" | tee -a "$SUMMARY"
    keep
  }
  IFS=';' read -ra VS <<<"${VARIANTS:-}"
  [ ${#VS[@]} -gt 0 ] || VS=("")
  model big --layers 8 --hidden 4096 --intermediate 8192 --heads 32 --vocab 32000
  python3 "$HELP" make-data "$W/b.jsonl" --samples 1024 --min-len 32 --max-len 768 --vocab 32000 | tee -a "$SUMMARY"
  if [[ " $PARTS " == *" b "* ]]; then
  fwd_rate b big 2,4,6
  i=0
  for v in "${VS[@]}"; do
    i=$((i + 1)); cp "$W/b.jsonl" "$W/bv$i.jsonl"
    tmpfs_run "bv$i" big 8 4096 "2, 4, 6" 1024 $((31200 + i)) "$v"
  done
  fi
  if [[ " $PARTS " == *" c "* ]]; then
  model wide --layers 4 --hidden 7168 --intermediate 18432 --heads 56 --vocab 32000
  C_SAMPLES=${C_SAMPLES:-1536}
  python3 "$HELP" make-data "$W/c.jsonl" --samples "$C_SAMPLES" --min-len 32 --max-len 768 --vocab 32000 | tee -a "$SUMMARY"
  say "output tmpfs: $(df -h "$TMPOUT" | tail -1 | tr -s ' ')"
  fwd_rate c wide 1,2,3
  k=0
  for spec in ${C_VARIANTS:-1}; do
    # J[:MOVERS[:huge]]: VARIANTS' J-th server setting, run.movers, the output on a
    # tmpfs of its own mounted huge=always (where this machine lets us mount).
    IFS=: read -r j m huge <<<"$spec"
    k=$((k + 1)); cp "$W/c.jsonl" "$W/cv$k.jsonl"
    out_dir=$TMPOUT
    if [ "${huge:-}" = huge ]; then
      out_dir=$TMPOUT-huge; mkdir -p "$out_dir"
      mountpoint -q "$out_dir" || mount -t tmpfs -o size=48g,huge=always tmpfs "$out_dir" || { say "variant cv$k: no huge=always tmpfs here (mount failed)"; continue; }
    fi
    say "variant cv$k: run.movers ${m:-${MOVERS:-8}}, output on $out_dir"
    TMPOUT=$out_dir MOVERS=${m:-${MOVERS:-8}} tmpfs_run "cv$k" wide 4 7168 "1, 2, 3" "$C_SAMPLES" $((31300 + k)) "${VS[$((j - 1))]}"
  done
  fi
  if [[ " $PARTS " == *" checks "* ]]; then
  head -256 "$W/b.jsonl" >"$W/bx.jsonl"
  SERVER_ARGS=${VS[0]} config bx "$W/models/big" 8 4096 "2, 4, 6" 16384 64 31299
  run_job bx; check bx "$W/models/big" batched 2,4,6; keep
  model tiny --layers 4 --hidden 256 --intermediate 512 --heads 4 --vocab 1000
  python3 "$HELP" make-data "$W/a1.jsonl" --samples 64 --min-len 4 --max-len 200 --vocab 1000 >>"$SUMMARY"
  cp "$W/a1.jsonl" "$W/a2.jsonl"
  SERVER_ARGS=${VS[0]} config a1 "$W/models/tiny" 4 256 "1, 2, 3" 4096 1 31101
  SERVER_ARGS=${VS[0]} config a2 "$W/models/tiny" 4 256 "1, 2, 3" 4096 16 31102
  run_job a1; check a1 "$W/models/tiny" exact 1,2,3
  run_job a2; check a2 "$W/models/tiny" batched 1,2,3; keep
  fi
fi

if [ "$MODE" = perf ] || [ "$MODE" = all ]; then
  # ---- (b) 8 layers x 4096
  model big --layers 8 --hidden 4096 --intermediate 8192 --heads 32 --vocab 32000
  python3 "$HELP" make-data "$W/b0.jsonl" --samples 1024 --min-len 32 --max-len 768 --vocab 32000 | tee -a "$SUMMARY"
  perf b0 big 8 4096 "2, 4, 6" 1024 16384 31103
  # ---- (c) 4 layers x 7168 (Kimi's width: 57 KiB a token)
  model wide --layers 4 --hidden 7168 --intermediate 18432 --heads 56 --vocab 32000
  python3 "$HELP" make-data "$W/c0.jsonl" --samples 384 --min-len 32 --max-len 768 --vocab 32000 | tee -a "$SUMMARY"
  perf c0 wide 4 7168 "1, 2, 3" 384 16384 31105
fi

say "== total $(python3 -c "print(round($(now) - $T0))")s; $([ $FAIL -eq 0 ] && echo PASS || echo FAIL)"
rm -rf "$SHM" "$TMPOUT"
# The device tool brings back what is under $OUT: the summary, doctor's report, log tails.
if [ -n "${OUT:-}" ]; then
  cp "$SUMMARY" "$OUT/" 2>/dev/null
  [ -f "$W/doctor.txt" ] && cp "$W/doctor.txt" "$OUT/"
  for j in a2 b1 b0 c0; do [ -f "$W/$j-out/.extract/logs/server.log" ] && tail -c 200000 "$W/$j-out/.extract/logs/server.log" >"$OUT/$j-server.log"; done
  [ -f "$W/b0t-server.log" ] && tail -c 200000 "$W/b0t-server.log" >"$OUT/b0t-server.log"
  [ -f "$W/b1-out/.extract/logs/extract.log" ] && tail -c 200000 "$W/b1-out/.extract/logs/extract.log" >"$OUT/b1-extract.log"
fi
echo; echo "==== SUMMARY"; cat "$SUMMARY"
exit $FAIL
