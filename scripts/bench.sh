#!/usr/bin/env bash
# scripts/bench.sh: measure extract's own overhead against the physical path, in one run.
#
# Every figure is measured next to its baseline in the same run (cp + sync on the same
# disks, the simulator alone on the same CPUs), and the table gives both and their ratio:
# absolute times on a shared machine are noise, the ratios are the point.
# docs/performance.md explains each figure and what it means for a real 8-GPU job.
#
#   scripts/bench.sh                  # all figures, then the table (3 to 5 minutes)
#   scripts/bench.sh --no-go-bench    # skip the `go test -bench` part
#   scripts/bench.sh --shards         # also figure 7: status --all, 8 shards × 1M (+2-3 min, 1.2 GB)
#   scripts/bench.sh --replicas       # also figure 8: the job with 1, 2, 4 and 8 replicas (+3-5 min)
#   scripts/bench.sh --only-replicas  # figure 1 (the disk's rate), then figure 8 only
#   BENCH_OUT=/nvme/bench scripts/bench.sh   # output dir on the disk to measure
#   BENCH_EXTRACT=bin/extract BENCH_BENCHTOOL=bin/benchtool scripts/bench.sh --no-go-bench
#                                     # on a machine without Go: prebuilt binaries
#
# Environment:
#   BENCH_OUT        output base dir, on the output disk, not a tmpfs (default: out/bench)
#   BENCH_SHM        staging base dir, on a tmpfs (default: /dev/shm/extract-bench)
#   BENCH_EXTRACT    an extract binary to measure instead of building ./cmd/extract
#   BENCH_BENCHTOOL  a benchtool binary instead of building ./scripts/benchtool
#   BENCH_COMMIT     the commit the binaries were built from, for machine.md (default: git's)
#
# Needs: cp, sync, about 8 GiB free on BENCH_OUT and 5 GiB on BENCH_SHM; Go only to build
# what is not given and for the `go test -bench` part. Everything it writes is removed at
# the end, except BENCH_OUT/{results.jsonl,table.md,machine.md,gobench.txt}.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
GO_BENCH=1
SHARDS=0
REPLICAS=0
ONLY_REPLICAS=0
for a in "$@"; do
	case "$a" in
	--no-go-bench) GO_BENCH=0 ;;
	--shards) SHARDS=1 ;;
	--replicas) REPLICAS=1 ;;
	--only-replicas) REPLICAS=1 ONLY_REPLICAS=1 GO_BENCH=0 ;;
	-h | --help)
		sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "bench.sh: unknown argument $a (see --help)" >&2
		exit 2
		;;
	esac
done

OUT=${BENCH_OUT:-$ROOT/out/bench}
SHM=${BENCH_SHM:-/dev/shm/extract-bench}
export CGO_CFLAGS=${CGO_CFLAGS:--Wno-deprecated-declarations}

mkdir -p "$OUT" "$SHM"
OUT=$(cd "$OUT" && pwd)
SHM=$(cd "$SHM" && pwd)
BIN=$OUT/bin
RESULTS=$OUT/results.jsonl

cleanup() {
	rm -rf "$SHM" "$BIN"
	for d in mover mover-out small e2e rss resume-37312 resume-1000000 gobench replicas; do
		rm -rf "${OUT:?}/$d"
	done
}
trap cleanup EXIT

fstype() { findmnt -f -n -o FSTYPE -T "$1" 2>/dev/null || stat -f -c %T "$1"; }
avail_gib() { df -P -B1G "$1" | awk 'NR==2 {print $4}'; }

if [ "$(fstype "$SHM")" != tmpfs ]; then
	echo "bench.sh: BENCH_SHM=$SHM is on $(fstype "$SHM"), not a tmpfs: staging must be one, as /dev/shm is" >&2
	exit 2
fi
if [ "$(fstype "$OUT")" = tmpfs ]; then
	echo "bench.sh: BENCH_OUT=$OUT is a tmpfs: fsync would cost nothing; point it at the output disk" >&2
	exit 2
fi
if [ "$(avail_gib "$OUT")" -lt 8 ] || [ "$(avail_gib "$SHM")" -lt 5 ]; then
	echo "bench.sh: need 8 GiB free on $OUT (has $(avail_gib "$OUT")) and 5 GiB on $SHM (has $(avail_gib "$SHM"))" >&2
	exit 2
fi
HAVE_GO=0
command -v go >/dev/null 2>&1 && HAVE_GO=1
if [ "$HAVE_GO" = 0 ] && { [ -z "${BENCH_EXTRACT:-}" ] || [ -z "${BENCH_BENCHTOOL:-}" ]; }; then
	echo "bench.sh: no Go here: give prebuilt binaries in BENCH_EXTRACT and BENCH_BENCHTOOL" >&2
	exit 2
fi
if [ "$HAVE_GO" = 0 ] && [ "$GO_BENCH" = 1 ]; then
	echo "bench.sh: no Go here: skipping the \`go test -bench\` part (as --no-go-bench)" >&2
	GO_BENCH=0
fi

start=$(date +%s)
echo "== build"
mkdir -p "$BIN"
if [ -n "${BENCH_EXTRACT:-}" ]; then
	cp "$BENCH_EXTRACT" "$BIN/extract"
else
	go build -o "$BIN/extract" ./cmd/extract
fi
if [ -n "${BENCH_BENCHTOOL:-}" ]; then
	cp "$BENCH_BENCHTOOL" "$BIN/benchtool"
else
	go build -o "$BIN/benchtool" ./scripts/benchtool
fi
rm -f "$RESULTS"

echo "== machine"
{
	echo "- CPU: $(nproc) × $(awk -F': ' '/model name/ {print $2; exit}' /proc/cpuinfo)"
	echo "- memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
	echo "- kernel: $(uname -r)"
	echo "- output: $OUT on $(df -P "$OUT" | awk 'NR==2 {print $1}') ($(fstype "$OUT") $(findmnt -f -n -o OPTIONS -T "$OUT" 2>/dev/null), $(avail_gib "$OUT") GiB free)"
	echo "- staging: $SHM ($(fstype "$SHM"), $(avail_gib "$SHM") GiB free)"
	if [ -n "${BENCH_COMMIT:-}" ]; then
		commit=$BENCH_COMMIT
	elif git rev-parse --short HEAD >/dev/null 2>&1; then
		commit="$(git rev-parse --short HEAD)$(git diff --quiet HEAD 2>/dev/null || echo ' + local changes')"
	else
		commit=unknown
	fi
	gov=prebuilt
	[ "$HAVE_GO" = 1 ] && gov=$(go version)
	echo "- load before: $(cut -d' ' -f1-3 /proc/loadavg) (1, 5, 15 min)"
	echo "- binaries: ${BENCH_EXTRACT:-built here} (${gov}), commit $commit"
} | tee "$OUT/machine.md"

T() { "$BIN/benchtool" "$@" -out "$OUT" -shm "$SHM" -results "$RESULTS"; }
X=(-extract "$BIN/extract")

echo "== figure 1: mover vs cp + sync, 8 × 256 MiB (and on a tmpfs: its own CPU cost against cp)"
T mover -rounds 3
# Figure 8 sets the simulators' rate from figure 1's cp + sync: 1.5× of it in all, split
# between the replicas, so the disk is the limit whatever their number.
replicas_figure() {
	echo "== figure 8: the whole job with 1, 2 and 4 simulator replicas, the disk the limit"
	T replicas "${X[@]}" -replicas 1,2,4 -n 32 -disk-fraction 1.5
	echo "== figure 8: overhead per sample with many small replicas (8 × 256 KiB dumps at full speed)"
	T replicas "${X[@]}" -replicas 8 -n 4000 -tokens-lo 32 -tokens-hi 32 -hidden 1024 -label "8 small replicas, 256 KiB dumps"
}
if [ "$ONLY_REPLICAS" = 1 ]; then
	replicas_figure
	echo
	echo "== results ($(($(date +%s) - start)) s; $RESULTS; load after: $(cut -d' ' -f1-3 /proc/loadavg))"
	"$BIN/benchtool" report -results "$RESULTS" | tee "$OUT/table.md"
	exit 0
fi
T mover -rounds 3 -tmpfs
T mover -rounds 3 -tmpfs -format specforge
echo "== figure 2: 256 KiB dumps through validate, move, fsync, index"
T small -n 2000
T e2e "${X[@]}" -fig 2 -n 2000 -tokens-lo 32 -tokens-hi 32 -hidden 1024 -label "small dumps"
echo "== figure 3: simulator alone vs the whole job (and figure 5: status while running)"
T e2e "${X[@]}" -n 32 -status-probes 10
T e2e "${X[@]}" -n 32 -disk-fraction 0.5 -status-probes 10
echo "== figure 4: time to the first request on --resume (and figure 5: status from the index)"
T resume "${X[@]}" -done 37312 -target 300ms -status-runs 5
T resume "${X[@]}" -done 1000000 -tokens-lo 32 -tokens-hi 32 -target 1s -status-runs 5
echo "== figure 6: peak RSS while moving 8 × 256 MiB"
T rss "${X[@]}"
if [ "$SHARDS" = 1 ]; then
	echo "== figure 7: status --all over 8 shards of 1M samples"
	T shards "${X[@]}" -shards 8 -per 1000000 -runs 21
fi
if [ "$REPLICAS" = 1 ]; then
	replicas_figure
fi

if [ "$GO_BENCH" = 1 ]; then
	echo "== go test -bench (mover, index commit path, watcher, dataset)"
	mkdir -p "$OUT/gobench"
	EXTRACT_BENCH_OUT=$OUT/gobench go test -run '^$' -benchtime 1s \
		-bench 'MoveFromStaging|SmallDumpFullPath|CommitDoneMovers|BeginAttempts/batch=1$|WatcherRenameToReport|OpenDataset' \
		./checkpoint/ ./shm/ ./orchestrator/ ./dataset/ 2>&1 | grep -E '^(Benchmark|ok|FAIL|---)' | tee "$OUT/gobench.txt" || echo 'bench.sh: go test -bench failed' >&2
fi

echo
echo "== results ($(($(date +%s) - start)) s; $RESULTS; load after: $(cut -d' ' -f1-3 /proc/loadavg))"
"$BIN/benchtool" report -results "$RESULTS" | tee "$OUT/table.md"
