#!/usr/bin/env bash
# One experiment's full setting in one call of the device machine (a GPU), within its per-call
# limit: `objreg experiment run NAME --seeds N --device cuda --out $OUT/NAME`, stopped at LIMIT
# seconds (default 540) so that the call returns what finished: each seed's result.json is written
# to $OUT/NAME/seed-S/ as it ends (`python -m objreg.experiments.docs pool NAME FILE` adds them to
# the committed result), the overall result.json when every seed is done, and the log to
# $OUT/NAME.log.
#
#   OUT=/tmp/gpu bash benchmarks/device_experiment.sh tapt 10           # on the GPU machine, repository root
#   OUT=/tmp/gpu bash benchmarks/device_experiment.sh tapt 1 --quick    # the quick setting on the CPU: checks it here
#
# An experiment whose seed does not fit one call runs in parts (screen-validity: a task, a seed and
# a slice of its candidates, `python -m objreg.experiments.screen_validity part`): PART names one,
# its JSON lands in $OUT/NAME/parts/, and `... screen_validity assemble DIR` combines them once all
# are there (SEEDS is then unused).
#
#   OUT=/tmp/gpu PART=sst2:0:0-2 bash benchmarks/device_experiment.sh screen-validity
set -u
: "${OUT:?set OUT to the output folder}"
NAME=${1:?name the experiment}
SEEDS=${2:-3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if [ "${3:-}" = "--quick" ]; then
    ARGS=(--quick --device cpu)
else
    ARGS=(--device cuda)
fi
LIMIT=${LIMIT:-540}
echo "== $NAME: $SEEDS seeds ${ARGS[*]} (limit ${LIMIT}s) $(date -u +%T)" >"$OUT/$NAME.log"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader >>"$OUT/$NAME.log" 2>&1 || true
start=$SECONDS
if [ -n "${PART:-}" ]; then
    module=objreg.experiments.${NAME//-/_}
    timeout "$LIMIT" "$PY" -m "$module" part "$PART" "${ARGS[@]}" --out "$OUT/$NAME" >>"$OUT/$NAME.log" 2>&1
else
    timeout "$LIMIT" "$PY" -m objreg experiment run "$NAME" --seeds "$SEEDS" "${ARGS[@]}" --out "$OUT/$NAME" \
        >>"$OUT/$NAME.log" 2>&1
fi
status=$?
echo "== $NAME: exit $status, $((SECONDS - start)) s" >>"$OUT/$NAME.log"
exit $status
