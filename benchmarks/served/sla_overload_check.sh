#!/usr/bin/env bash
# SLA admission on the real CPU engine (docs/benchmarks.md, "SLA admission"): tierserve (hybrid,
# --sla-admission on) under a closed-loop load that overloads a 2-core CPU, measured by
# `tierserve bench serve`; then the predictor's error and the refusal answer times from what the
# load generator recorded (benchmarks/served/sla_prediction_report.py):
#
#   benchmarks/served/sla_overload_check.sh                    # ~2.5 min with the defaults
#   OUT=out/smoke DURATION=10 WARMUP=2 benchmarks/served/sla_overload_check.sh     # smoke test
#
# Every setting below can be overridden from the environment (SLA=off: the same load without
# admission control, for comparison). The settings are the seed experiment's
# (benchmarks/served/serve_seed_experiment.sh). Run it on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/../.."

TS=${TIERSERVE:-.venv/bin/tierserve}
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-out/sla-overload}
SLA=${SLA:-on}
MARGIN=${MARGIN:-0.8}
CONCURRENCY=${CONCURRENCY:-64}
DURATION=${DURATION:-90}
WARMUP=${WARMUP:-30}
DRAIN=${DRAIN:-30}
SEED=${SEED:-0}
PORT=${PORT:-8124}

mkdir -p "$OUT"
URL="http://127.0.0.1:$PORT"
"$TS" serve --policy hybrid --sla-admission "$SLA" --sla-margin "$MARGIN" --port "$PORT" \
  --max-num-seqs 32 --max-num-batched-tokens 512 --num-kv-blocks 1456 --log-level warning \
  > "$OUT/server.log" 2>&1 &
server_pid=$!
trap 'kill -TERM $server_pid 2>/dev/null || true; wait $server_pid 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  if "$PY" -c "import httpx, sys; sys.exit(httpx.get('$URL/ready').status_code != 200)" \
    2>/dev/null; then
    break
  fi
  kill -0 "$server_pid" 2>/dev/null || { echo "the server exited; see $OUT/server.log" >&2; exit 1; }
  sleep 0.5
done
"$TS" bench serve --base-url "$URL" --api completions --ignore-eos --lengths cpu --seed "$SEED" \
  --concurrency "$CONCURRENCY" --duration "$DURATION" --warmup "$WARMUP" \
  --drain-timeout "$DRAIN" --label "hybrid, SLA admission $SLA" --no-progress --out "$OUT"
"$PY" -c "import httpx; print(httpx.get('$URL/metrics').text)" > "$OUT/metrics.txt"
"$PY" benchmarks/served/sla_prediction_report.py "$OUT" | tee "$OUT/sla.md"
