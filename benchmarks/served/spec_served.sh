#!/usr/bin/env bash
# Speculative decoding served, off versus on (issue 25's load targets), one server at a time:
#
#   benchmarks/served/spec_served.sh            # ~12 min on 2 cores; results under $OUT
#
# 1. mixed load: `tierserve bench serve` at 32 clients, the P0 5% / P1 60% / P2 30% / P3 5% mix,
#    128-token random prompts, 64-token outputs (--ignore-eos), 60 s: output tok/s, P0 TPOT;
# 2. flood: 16 seats held by 32 background P3 streams of 300 tokens, a P0 probe every 3 s
#    (16 tokens), then P0 TPOT under the flood and background tok/s.
# `SPEC` is the --speculative-config of the "on" runs; `SERVE_ARGS`, more `tierserve serve` flags
# for both (word-split, e.g. "--kv-cache-dtype float16"). Prints one table, the CPU on top.
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)
OUT=${OUT:-/tmp/spec-served}
PORT=${PORT:-8012}
SPEC=${SPEC:-'{"method": "ngram", "num_speculative_tokens": 4}'}
SERVE_ARGS=${SERVE_ARGS:-}
TS=$REPO/.venv/bin/tierserve
mkdir -p "$OUT"
SERVER_PID=
stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  kill -TERM -- "-$SERVER_PID" 2>/dev/null || kill -TERM "$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID" 2>/dev/null; SERVER_PID=; sleep 3
}
trap stop_server EXIT
start() {  # mode [extra args]
  local mode=$1; shift
  local extra=()
  # shellcheck disable=SC2206  # SERVE_ARGS is word-split on purpose
  extra=($SERVE_ARGS)
  [ "$mode" = on ] && extra+=(--speculative-config "$SPEC")
  setsid "$TS" serve --port "$PORT" --served-model-name smollm2 --log-level warning \
    "${extra[@]}" "$@" >"$OUT/server-$mode.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 120); do curl -sf "http://127.0.0.1:$PORT/ready" >/dev/null && return 0; sleep 1; done
  echo "server did not start: $OUT/server-$mode.log" >&2; return 1
}
bench() {  # label args...
  local label=$1; shift
  "$TS" bench serve --base-url "http://127.0.0.1:$PORT" --model smollm2 --api chat \
    --priority-via body --prompt-len 128 --ignore-eos --temperature 0 --no-progress \
    --out "$OUT/$label" --label "$label" "$@" >"$OUT/$label.log" 2>&1
  curl -sf "http://127.0.0.1:$PORT/metrics" >"$OUT/$label-metrics.txt"  # the drafts' counters
}
lscpu | sed -n 's/^Model name: *//p' >"$OUT/cpu.txt"
for mode in off on; do
  start "$mode" && bench "mixed-$mode" --concurrency 32 --mix 5 60 30 5 --duration 60 \
    --warmup 10 --output-len 64 && stop_server
  start "$mode" --max-num-seqs 16 && bench "flood-$mode" --scenario flood --flood-streams 32 \
    --probe-interval 3 --idle-probes 5 --duration 90 --output-len 16 64 64 300 && stop_server
done
OUT=$OUT "$REPO/.venv/bin/python" - <<'PY'
import json, os
from pathlib import Path
out = Path(os.environ["OUT"])
def load(p):
    try:
        return json.loads((out / p / "results.json").read_text())
    except (OSError, ValueError):
        return None
print("CPU:", (out / "cpu.txt").read_text().strip())
print("| run | off | on | on / off |")
print("|---|---|---|---|")
def row(name, off, on, fmt):
    if off is None or on is None:
        print(f"| {name} | {off} | {on} | - |"); return
    print(f"| {name} | {fmt(off)} | {fmt(on)} | {on / off:.2f} |")
m = {k: load(f"mixed-{k}") for k in ("off", "on")}
f = {k: load(f"flood-{k}") for k in ("off", "on")}
ms = lambda v: f"{1e3 * v:.1f} ms"
tps = lambda v: f"{v:.1f}"
if all(m.values()):
    run = {k: m[k]["runs"][0] for k in m}
    row("mixed, 32 clients: output tok/s", run["off"]["throughput_tokens_per_s"], run["on"]["throughput_tokens_per_s"], tps)
    row("mixed: P0 mean TPOT", run["off"]["classes"]["P0"]["tpot_mean_s"], run["on"]["classes"]["P0"]["tpot_mean_s"], ms)
    row("mixed: P0 mean TTFT", run["off"]["classes"]["P0"]["ttft_mean_s"], run["on"]["classes"]["P0"]["ttft_mean_s"], ms)
if all(f.values()):
    fl = {k: f[k]["flood"] for k in f}
    row("flood: P0 mean TPOT", fl["off"]["p0_loaded_tpot_mean_s"], fl["on"]["p0_loaded_tpot_mean_s"], ms)
    row("flood: P0 TTFT P95", fl["off"]["p0_loaded_ttft_p95_s"], fl["on"]["p0_loaded_ttft_p95_s"], ms)
    row("flood: background tok/s", fl["off"]["background_throughput_tokens_per_s"], fl["on"]["background_throughput_tokens_per_s"], tps)
# What the drafts did in the "on" runs (the server's counters over its life, warm-up included).
for run in ("mixed-on", "flood-on"):
    try:
        text = (out / f"{run}-metrics.txt").read_text()
    except OSError:
        continue
    tot = {}
    for line in text.splitlines():
        for name in ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total"):
            if line.startswith(name):
                tot[name.split("_num_")[1]] = tot.get(name.split("_num_")[1], 0.0) + float(line.split()[-1])
    if tot:
        d, a = tot.get("draft_tokens_total", 0.0), tot.get("accepted_tokens_total", 0.0)
        print(f"{run}: {d:.0f} draft tokens, {a:.0f} accepted ({a / d if d else 0:.2f})")
PY
