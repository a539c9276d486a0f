#!/usr/bin/env bash
# The GPU check in one device call (< 8 min on one H200), everything packed into
# $OUT/results.tgz after each part. Prepare first, here: python benchmarks/gpu/prepare.py --wheels
# then, with the device tool: carry benchmarks/gpu/.carry and run  bash benchmarks/gpu/check.sh
# SMALL=1 runs the same parts on a CPU with a tiny model (tests/test_gpu_check.py does).
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
CARRY=${CARRY:-$ROOT/benchmarks/gpu/.carry}
R=${OUT:-/tmp/gpu-check}; mkdir -p "$R"
W=$(mktemp -d); M=${MODEL_DIR:-/dev/shm/tierserve-gpu-model}; rm -rf "$M"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export TIERSERVE_CACHE_DIR=$W/cache
if [ -z "${SMALL:-}" ]; then
  PY=python3
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$W/site" "$CARRY"/whl/*.whl \
    || { echo "wheel install failed (run prepare.py --wheels first)"; exit 1; }
  export PYTHONPATH=$W/site:$ROOT/src:$ROOT
  DEV=cuda; SHAPE=8b; SERVE="--max-num-seqs 256"; LEVELS="1 8 32 128 256"; DUR=15; FLOOD=64
  BATCHES="1 8 64 256"; PROFILE=""; FLOOD_S=25
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$W/env.txt" 2>&1
else
  PY=${PY:-python3}
  export PYTHONPATH=$ROOT/src:$ROOT TIERSERVE_KERNELS=off  # the PyTorch path, as on CUDA
  DEV=cpu; SHAPE=tiny; SERVE="--kv-cache-gib 0.1 --max-num-seqs 8"; LEVELS="1 2"; DUR=${DUR:-3}
  FLOOD=2; BATCHES="1 4"; PROFILE="--tiny --device cpu --repeats 1"; FLOOD_S=8
  M=$W/model
fi
$PY -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, \
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no cuda')" >> "$W/env.txt" 2>&1
(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo "not a git checkout"; nproc) >> "$W/env.txt"
cat "$W/env.txt"
pack() { (cd "$W" && tar czf "$R/results.tgz" --exclude=cache --exclude=site --exclude=model . ); }
T0=$(date +%s); say() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }

say "model: random $SHAPE folder"
$PY benchmarks/gpu/make_model.py "$M" $SHAPE --tok "$CARRY/tok" > "$W/model.log" 2>&1
echo "rc=$?" >> "$W/model.log"; tail -2 "$W/model.log"; pack

say "tests: the gpu marker (skipped without CUDA)"
timeout 180 $PY -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu.py > "$W/tests.log" 2>&1
echo "rc=$?" >> "$W/tests.log"; tail -3 "$W/tests.log"; pack

say "steps: decode step times, graphs against eager"
for mode in capture off; do
  timeout 200 $PY benchmarks/gpu/gpu_profile.py $PROFILE --decode-graphs $mode --decode-only \
    --batches $BATCHES --out "$W/steps_$mode.json" > "$W/steps_$mode.log" 2>&1
  echo "rc=$?" >> "$W/steps_$mode.log"; tail -6 "$W/steps_$mode.log"; pack
done

if [ -z "${SMALL:-}" ]; then
  say "attention: the Triton kernel against the PyTorch reference"
  timeout 120 $PY benchmarks/gpu/attention_bench.py > "$W/attention.json" 2> "$W/attention.log"
  echo "rc=$?" >> "$W/attention.log"; cat "$W/attention.json"; pack
fi

say "serve + bench serve"
PORT=${PORT:-8011}
$PY -m tierserve serve "$M" --device $DEV --port $PORT $SERVE > "$W/serve.log" 2>&1 &
SP=$!
up=0
for _ in $(seq 1 240); do
  $PY -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:$PORT/health').status_code != 200)" \
    2>/dev/null && { up=1; break; }
  kill -0 $SP 2>/dev/null || break; sleep 1
done
say "server up=$up"; tail -4 "$W/serve.log"
if [ $up = 1 ]; then
  timeout 300 $PY -m tierserve bench serve --base-url http://127.0.0.1:$PORT --concurrency $LEVELS \
    --prompt-len 128 --output-len 64 --ignore-eos --duration $DUR --warmup 1 --drain-timeout 20 \
    --priority-via header --mix 0 100 0 0 --tokenizer "$M" --out "$W/bench" --no-progress \
    > "$W/bench.log" 2>&1
  echo "rc=$?" >> "$W/bench.log"; tail -12 "$W/bench.log"; pack
  say "flood: P0 probes under background streams"
  timeout 150 $PY -m tierserve bench serve --base-url http://127.0.0.1:$PORT --scenario flood \
    --flood-streams $FLOOD --prompt-len 128 --output-len 128 --ignore-eos --duration $FLOOD_S \
    --idle-probes 3 --probe-interval 1 --tokenizer "$M" --out "$W/flood" --no-progress \
    > "$W/flood.log" 2>&1
  echo "rc=$?" >> "$W/flood.log"; tail -10 "$W/flood.log"
fi
kill $SP 2>/dev/null; sleep 2; kill -9 $SP 2>/dev/null
pack; say "done: $R/results.tgz"
