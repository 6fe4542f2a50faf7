#!/usr/bin/env bash
# The GPU figures of docs/performance.md in one call of the device machine (its python3 holds
# torch and transformers; nothing is installed): the probe benchmark at BERT-base and GPT-2 small
# on CUDA (dots, alignment, in-run alignment at k = 1 and the default k, second order, a whole
# probed step), the default `objreg analyze` job on CUDA, and the checkpoint cost of a BERT-base
# AdamW 3-objective run with --out. Every output goes under $OUT (six files).
#
#   OUT=/tmp/gpu bash benchmarks/gpu_run.sh          # on the GPU machine, from the repository root
#   OUT=/tmp/gpu bash benchmarks/gpu_run.sh --quick  # toy sizes on the CPU: checks the script here
#
# Each part has its own time limit (the device call has one overall limit), so one part that runs
# long costs its own figures only.
set -u
: "${OUT:?set OUT to the output folder}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LOG="$OUT/log.txt"

if [ "${1:-}" = "--quick" ]; then
    DEV=cpu
    PROBE=(--quick --repeats 1 --batch-size 2 --seq-len 16)
    ANALYZE=(--steps 2 --batch-size 4 --seq-len 32 --eval-size 8 --head-fit-size 16)
    CHECKPOINT=(--model default --steps 2)
    LIMIT_PROBE=300; LIMIT_ANALYZE=300; LIMIT_CHECKPOINT=300
else
    DEV=cuda
    PROBE=(--repeats 5 --batch-size 4 --seq-len 128)
    ANALYZE=()
    CHECKPOINT=(--model bert-base --steps 3)
    LIMIT_PROBE=100; LIMIT_ANALYZE=110; LIMIT_CHECKPOINT=80
fi

part() {  # part NAME LIMIT COMMAND...: run it with its limit, stdout to $OUT/NAME, stderr to the log
    local name=$1 limit=$2
    shift 2
    echo "== $name: $* (limit ${limit}s) $(date -u +%T)" >>"$LOG"
    local start=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name" 2>>"$LOG"
    echo "== $name: exit $?, $((SECONDS - start)) s" >>"$LOG"
}

{
    nvidia-smi 2>&1 || true
    "$PY" -c "import sys, torch, transformers; print(sys.version); print('torch', torch.__version__, \
'transformers', transformers.__version__, 'cuda', torch.cuda.is_available() and torch.cuda.get_device_name())"
    nproc
} >"$OUT/machine.txt" 2>&1

part probe_bert.json "$LIMIT_PROBE" "$PY" -m benchmarks.probe --json --device "$DEV" --models bert-base "${PROBE[@]}"
part probe_gpt2.json "$LIMIT_PROBE" "$PY" -m benchmarks.probe --json --device "$DEV" --models gpt2-small "${PROBE[@]}"
part analyze.json "$LIMIT_ANALYZE" "$PY" -m objreg analyze --pretrain mlm,sop --downstream qa --device "$DEV" --json \
    "${ANALYZE[@]}"
part checkpoint.json "$LIMIT_CHECKPOINT" "$PY" -m benchmarks.checkpoint_cost --json --device "$DEV" --optimizer adamw \
    --pretrain mlm,sop,clm "${CHECKPOINT[@]}"
tail -n 8 "$LOG"
