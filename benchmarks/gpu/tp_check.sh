#!/usr/bin/env bash
# Tensor parallelism on a machine with several GPUs (issue 44), in one call: what no machine here
# has run yet. TP=N against TP=1 on the random 8B-shaped folder: the answers (prompt logprobs and
# greedy tokens, bf16), then served output tok/s at each level for both, then a worker killed
# under load (the stream must end with an error, the server must exit 1). Results packed into
# $OUT/results.tgz after each part. Prepare first, here: python benchmarks/gpu/prepare.py --wheels
# then, on the machine:  TP=2 bash benchmarks/gpu/tp_check.sh   (TP: default every GPU)
# SMALL=1 runs the same parts on a CPU with a tiny model at TP=2.
set -u
cd "$(dirname "$0")/../.."
ROOT=$PWD
CARRY=${CARRY:-$ROOT/benchmarks/gpu/.carry}
R=${OUT:-/tmp/gpu-tp-check}; mkdir -p "$R"
W=$(mktemp -d); M=${MODEL_DIR:-/dev/shm/tierserve-gpu-model}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export TIERSERVE_CACHE_DIR=$W/cache
if [ -z "${SMALL:-}" ]; then
  PY=python3
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$W/site" "$CARRY"/whl/*.whl \
    || { echo "wheel install failed (run prepare.py --wheels first)"; exit 1; }
  export PYTHONPATH=$W/site:$ROOT/src:$ROOT
  N=${TP:-$(nvidia-smi -L | wc -l)}
  DEV=cuda; SHAPE=8b; SERVE="--max-num-seqs 256"; LEVELS="1 8 32 128 256"; DUR=15
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$W/env.txt" 2>&1
  nvidia-smi topo -m >> "$W/env.txt" 2>&1
else
  PY=${PY:-python3}
  export PYTHONPATH=$ROOT/src:$ROOT
  N=${TP:-2}; DEV=cpu; SHAPE=tiny; SERVE="--kv-cache-gib 0.1 --max-num-seqs 8"; LEVELS="1 4"
  DUR=${DUR:-3}; M=$W/model
fi
(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo "not a git checkout"; echo "TP=$N") >> "$W/env.txt"
cat "$W/env.txt"
pack() { (cd "$W" && tar czf "$R/results.tgz" --exclude=cache --exclude=site --exclude=model . ); }
T0=$(date +%s); say() { echo "[+$(( $(date +%s) - T0 ))s] $*"; }

[ -d "$M" ] || $PY benchmarks/gpu/make_model.py "$M" $SHAPE --tok "$CARRY/tok" > "$W/model.log" 2>&1

say "answers: TP=$N against TP=1"
timeout 600 $PY benchmarks/quality/tp_parity.py --model "$M" --tp "$N" --device $DEV \
  --activations float32 --out "$W/parity.json" > "$W/parity.log" 2>&1
echo "rc=$?" >> "$W/parity.log"; tail -3 "$W/parity.log"; pack

PORT=${PORT:-8012}
serve_and_bench() {  # $1: tensor parallel size
  $PY -m tierserve serve "$M" --device $DEV --port $PORT $SERVE -tp "$1" > "$W/serve_tp$1.log" 2>&1 &
  SP=$!; up=0
  for _ in $(seq 1 600); do
    $PY -c "import httpx,sys; sys.exit(httpx.get('http://127.0.0.1:$PORT/health').status_code != 200)" \
      2>/dev/null && { up=1; break; }
    kill -0 $SP 2>/dev/null || break; sleep 1
  done
  say "TP=$1 server up=$up"; tail -3 "$W/serve_tp$1.log"
  [ $up = 1 ] && timeout 600 $PY -m tierserve bench serve --base-url http://127.0.0.1:$PORT \
    --concurrency $LEVELS --prompt-len 128 --output-len 64 --ignore-eos --duration $DUR \
    --warmup 1 --drain-timeout 20 --mix 0 100 0 0 --tokenizer "$M" --out "$W/bench_tp$1" \
    --no-progress > "$W/bench_tp$1.log" 2>&1
  echo "rc=$?" >> "$W/bench_tp$1.log"; tail -8 "$W/bench_tp$1.log"; pack
}

say "served: TP=1, then TP=$N"
serve_and_bench 1; kill $SP 2>/dev/null; wait $SP 2>/dev/null
serve_and_bench "$N"

say "a worker killed under load: every stream ends, the server exits 1"
timeout 120 $PY -m tierserve bench serve --base-url http://127.0.0.1:$PORT --concurrency 8 \
  --prompt-len 128 --output-len 512 --ignore-eos --duration 20 --warmup 0 --drain-timeout 30 \
  --mix 0 100 0 0 --tokenizer "$M" --out "$W/bench_kill" --no-progress > "$W/bench_kill.log" 2>&1 &
BP=$!; sleep 5
WPID=$(grep -o "worker pids \[[0-9, ]*\]" "$W/serve_tp$N.log" | grep -o "[0-9]\+" | head -1)
say "killing worker pid ${WPID:-?}"; [ -n "$WPID" ] && kill -9 "$WPID"; sleep 1
curl -s "http://127.0.0.1:$PORT/health" > "$W/health_after_kill.txt" 2>&1
wait $SP; echo "server exit status $?" | tee "$W/exit.txt"
wait $BP; echo "rc=$?" >> "$W/bench_kill.log"; tail -6 "$W/bench_kill.log"
pack; say "done: $R/results.tgz"
