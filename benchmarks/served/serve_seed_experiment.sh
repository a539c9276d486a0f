#!/usr/bin/env bash
# The real-engine seed experiment (docs/benchmarks.md, "Load generator"): tierserve with fcfs,
# drr and hybrid in turn, one server at a time, under closed-loop load that overloads a 2-core
# CPU (the default class mix 5/60/30/5, lengths ~10x shorter than the simulator's: --lengths cpu),
# then the flood scenario on the same server, then the simulator's cpu-local prediction for the
# same workload, then one side-by-side report:
#
#   benchmarks/served/serve_seed_experiment.sh                 # ~20 min with the defaults
#   OUT=out/smoke DURATION=4 WARMUP=1 CONCURRENCY="2 4" FLOOD_DURATION=4 FLOOD_STREAMS=2 \
#       FLOOD_SETTLE=1 PROBE_INTERVAL=1 POLICIES="fcfs hybrid" \
#       benchmarks/served/serve_seed_experiment.sh                               # smoke test
#
# Every setting below can be overridden from the environment. Requests use the completions API
# (no chat template: prompts are exactly the token counts the simulator sees) with --ignore-eos
# (outputs are exactly max_tokens, as in the simulator). Run it on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/../.."

TS=${TIERSERVE:-.venv/bin/tierserve}
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-out/serve-seed}
POLICIES=${POLICIES:-"fcfs drr hybrid"}
CONCURRENCY=${CONCURRENCY:-"16 64"}
DURATION=${DURATION:-120}
WARMUP=${WARMUP:-30}
DRAIN=${DRAIN:-60}
LENGTHS=${LENGTHS:-cpu}
LENGTH_SCALE=${LENGTH_SCALE:-1}
SEED=${SEED:-0}
PORT=${PORT:-8123}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-32}
MAX_BATCHED=${MAX_BATCHED:-512}
KV_BLOCKS=${KV_BLOCKS:-1456}  # ~1 GiB of float32 KV for SmolLM2-135M
FLOOD_STREAMS=${FLOOD_STREAMS:-24}
FLOOD_DURATION=${FLOOD_DURATION:-60}
PROBE_INTERVAL=${PROBE_INTERVAL:-2}
FLOOD_SETTLE=${FLOOD_SETTLE:-10}  # seconds of background load before the first probe
SIM=${SIM:-1}  # 0: skip the simulator's prediction

mkdir -p "$OUT"
URL="http://127.0.0.1:$PORT"
WORKLOAD=(--api completions --ignore-eos --lengths "$LENGTHS" --length-scale "$LENGTH_SCALE")
server_pid=""

stop_server() {
  if [[ -n $server_pid ]]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}
trap stop_server EXIT

start_server() {  # $1: policy
  "$TS" serve --policy "$1" --port "$PORT" --max-num-seqs "$MAX_NUM_SEQS" \
    --max-num-batched-tokens "$MAX_BATCHED" --num-kv-blocks "$KV_BLOCKS" --log-level warning \
    > "$OUT/server-$1.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 600); do
    if "$PY" -c "import httpx, sys; sys.exit(httpx.get('$URL/ready').status_code != 200)" \
      2>/dev/null; then
      return 0
    fi
    if ! kill -0 "$server_pid" 2>/dev/null; then
      echo "the $1 server exited; see $OUT/server-$1.log" >&2
      exit 1
    fi
    sleep 0.5
  done
  echo "the $1 server was not ready after 5 minutes" >&2
  exit 1
}

compare=()
for policy in $POLICIES; do
  echo "== $policy: load at concurrency $CONCURRENCY"
  start_server "$policy"
  # shellcheck disable=SC2086  # CONCURRENCY is a list
  "$TS" bench serve --base-url "$URL" "${WORKLOAD[@]}" --seed "$SEED" \
    --concurrency $CONCURRENCY --duration "$DURATION" --warmup "$WARMUP" \
    --drain-timeout "$DRAIN" --label "$policy" --out "$OUT/$policy"
  compare+=("$OUT/$policy")
  echo "== $policy: flood scenario, $FLOOD_STREAMS background streams"
  # Another seed: prompts the prefix cache has not seen in the load run.
  "$TS" bench serve --base-url "$URL" "${WORKLOAD[@]}" --seed "$((SEED + 1000))" \
    --scenario flood --flood-streams "$FLOOD_STREAMS" --duration "$FLOOD_DURATION" \
    --probe-interval "$PROBE_INTERVAL" --flood-settle "$FLOOD_SETTLE" --label "flood $policy" --out "$OUT/flood-$policy"
  compare+=("$OUT/flood-$policy")
  stop_server
done

if [[ $SIM == 1 ]]; then
  echo "== simulator prediction (cpu-local)"
  policy_args=()
  for policy in $POLICIES; do policy_args+=(--policy "$policy"); done
  # shellcheck disable=SC2086
  "$PY" benchmarks/simulation/serve_sim_prediction.py --out "$OUT/sim" "${policy_args[@]}" \
    --concurrency $CONCURRENCY --duration "$DURATION" --warmup "$WARMUP" --seed "$SEED" \
    --lengths "$LENGTHS" --length-scale "$LENGTH_SCALE" --max-num-seqs "$MAX_NUM_SEQS" \
    --max-num-batched-tokens "$MAX_BATCHED" --num-kv-blocks "$KV_BLOCKS"
  compare+=("$OUT/sim")
fi

"$TS" bench serve --compare "${compare[@]}" --out "$OUT/compare"
echo "report: $OUT/compare/compare.md"
