#!/usr/bin/env bash
# One shard of an extract job per Slurm array task. Submit the whole job with
#
#   sbatch --array=0-7 scripts/slurm/extract-array.sh            # 8 shards, ids 0..n-1
#
# and resubmit one task (after a scancel, a node loss, a timeout) with the count pinned,
# since a one-task array does not say it (SLURM_ARRAY_TASK_COUNT is 1 there):
#
#   sbatch --array=5 --export=ALL,EXTRACT_SHARD_COUNT=8 scripts/slurm/extract-array.sh
#
# Each task runs `extract run --resume --shard auto`: shard SLURM_ARRAY_TASK_ID of the
# array's size owns samples [i*N/n, (i+1)*N/n) (`extract plan --shards n` prints them),
# keeps its index in state_dir/shard-<i>-of-<n> and writes into the shared output_dir.
# The run is idempotent per shard: a repeat of a finished shard exits 0 at once, a repeat
# of a killed one resumes where its index says, so requeueing and resubmitting are always
# safe. The config comes from EXTRACT_CONFIG (or EXTRACT_* variables) in the submitting
# environment, which sbatch passes on by default. `extract status --all` and
# `extract verify --all` (from any node that sees state_dir) show and check the whole job.
#
# The data stage's regeneration splits the same way: SHARD_COMMAND=generate runs
# `extract generate --resume --shard auto` per task (each shard writes
# state_dir/shard-<i>-of-<n>/generate/generated.jsonl; in shard order they are the file).
#
# Real nodes: one shard per 8-GPU node. Add to the #SBATCH lines (or the sbatch command):
#   --nodes=1 --exclusive --gres=gpu:8 --time=...
#SBATCH --job-name=extract
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=extract-%A_%a.out
set -uo pipefail
case "${1:-}" in
-h | --help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
-*) echo "extract-array.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
esac

# Shards that share a node need their own server port (a one-shard-per-node cluster
# leaves SHARD_PORT_BASE unset and uses server.port).
if [[ -n "${SHARD_PORT_BASE:-}" ]]; then
    export EXTRACT_SERVER_PORT=$((SHARD_PORT_BASE + SLURM_ARRAY_TASK_ID))
fi

# This shell outlives extract: a scancel's SIGTERM reaches every process of the task,
# and a shell that died of it at once would orphan extract, which Slurm (tracking by
# parentage with proctrack/linuxproc) would then no longer see: it would keep the
# shard's lock while a resubmitted task starts. So the shell only notes the signal and
# waits; extract stops gracefully on its own SIGTERM (drain, commit, stop its server),
# and Slurm's SIGKILL after KillWait ends whatever is left. The signal is not passed
# on: a second SIGTERM makes extract stop at once.
cancelled=0
trap 'cancelled=1' TERM INT
extract "${SHARD_COMMAND:-run}" --resume --shard auto &
pid=$!
rc=0
while :; do
    wait "$pid" && rc=0 || rc=$?
    # wait returns early (>128) when a trapped signal arrives; go on waiting for extract.
    kill -0 "$pid" 2>/dev/null || break
done

# Exit 75 is a temporary failure (the server kept dying, the index was busy): put this
# task back in the queue, a bounded number of times, instead of failing the array. Not
# after a scancel: a cancelled task stays cancelled.
if [[ $rc -eq 75 && $cancelled -eq 0 && ${SLURM_RESTART_COUNT:-0} -lt ${MAX_REQUEUES:-3} ]]; then
    echo "extract exited 75 (temporary); requeueing ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID} (restart ${SLURM_RESTART_COUNT:-0})" >&2
    scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
fi
exit "$rc"
