#!/usr/bin/env bash
# Serves the embedded SmolLM2 GGUF with llama.cpp's server (setup-llamacpp.sh) on
# 127.0.0.1:PORT: continuous batching, SLOTS parallel sequences (default 32) of 2048 tokens of
# context each, all cores, the GGUF's own chat template (--jinja), model name smollm2.
#
#   benchmarks/peers/llamacpp-serve.sh PORT [q4_1|q8_0|f32] [SLOTS] [llama-server args...]
set -euo pipefail
HERE=$(dirname "$(readlink -f "$0")")
P=${LLAMACPP_PEER:-/tmp/llamacpp-peer}
[ $# -ge 1 ] || { echo "usage: $0 PORT [q4_1|q8_0|f32] [SLOTS] [args...]" >&2; exit 2; }
[ -x "$P/bin/llama-server" ] || { echo "llama.cpp peer not built: run $HERE/setup-llamacpp.sh" >&2; exit 2; }
PORT=$1
Q=${2:-q4_1}
NP=${3:-32}
shift $(($# < 3 ? $# : 3))
exec "$P/bin/llama-server" -m "$P/smollm2-$Q.gguf" --alias smollm2 --host 127.0.0.1 \
  --port "$PORT" -np "$NP" -c $((NP * 2048)) -t "$(nproc)" -tb "$(nproc)" --no-webui --jinja "$@"
