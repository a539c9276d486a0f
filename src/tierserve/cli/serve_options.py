"""The one table of `tierserve serve` settings: each `Option` names its flag, where its value goes
in the `ServeConfig` tree (serve_config.py), its type, its help and, where the flag's value is
not the field's, how to turn one into the other. The argparse flags and the `--config` file
schema are both generated from `OPTIONS`; a setting's default is its destination field's
default, or `resolve_defaults`'s where it depends on the device. Torch-free."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tierserve.config import SchedulerConfig
from tierserve.core.speculation.config import parse_speculative_config
from tierserve.engine.args import parse_predictive
from tierserve.host.threads import parse_threads
from tierserve.priority import parse_priority
from tierserve.setting import declared


def size(text: str) -> int | float:
    """A partition size: '0.2' is a fraction of the pool, '128' a block count."""
    return float(text) if any(c in str(text) for c in ".eE") else int(text)


def sla(text: str) -> float | None:
    return None if str(text).lower() in ("none", "null", "-") else float(text)


def float_or_none(text) -> float | str:
    """A number, or 'none' (kept as the word: a flag's None means "not given")."""
    if str(text).lower() in ("none", "null", "-"):
        return "none"
    return float(text)


def on_off(text) -> bool:
    """'on' / 'off' (a flag), or a YAML boolean (a config file)."""
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value not in ("on", "off"):
        raise argparse.ArgumentTypeError(f"expected on or off, got {text!r}")
    return value == "on"


@dataclass(frozen=True)
class Option:
    """One setting: `--flag` on the command line, `key` in a `--config` file, `dest` in the tree
    ("section.field"; None: consumed before the tree is built)."""

    flag: str
    dest: str | None
    type: Callable = str
    nargs: int | str | None = None
    help: str = ""
    switch: bool = False  # a flag without a value (store_true); a boolean in a file
    to_field: Callable[[Any], Any] | None = None  # the option's value -> the field's
    short: str | None = None  # a short spelling of the flag (vLLM's, such as -tp)

    @property
    def key(self) -> str:
        return self.flag[2:].replace("-", "_")


def _not(value: bool) -> bool:
    return not value


def _none_word(value):
    return None if value == "none" else value


def _priorities(names) -> tuple:
    return tuple(parse_priority(n) for n in names)


def _scheduler(flag: str, type: Callable, to_field: Callable | None = None) -> Option:
    """A scheduler setting's flag: its help, default and check are declared once, on its
    SchedulerConfig field (config.py); the engine's record carries it under the same name."""
    key = flag[2:].replace("-", "_")
    default, s = declared(SchedulerConfig, key)
    shown = {True: "on", False: "off", None: "none"}.get(default, default)
    text = s.help if "(default" in s.help else f"{s.help} ({shown})"
    return Option(flag, E + key, type, None, text, to_field=to_field)


def _switch(flag: str, dest: str, text: str, negate: bool = True) -> Option:
    return Option(flag, dest, bool, None, text, switch=True, to_field=_not if negate else bool)


# One entry in a few lines (flag, dest, type, nargs, help[, to_field]), kept as written:
# fmt: off
E, P, S = "engine.", "engine.policy.", "server."
PART, ADM, C = "engine.partitions.", "engine.admission.", "cluster."
OPTIONS: tuple[Option, ...] = (
    Option(
        "--model", E + "model", str, None,
        "GGUF file or Hugging Face folder (default: embedded SmolLM2-135M)"
    ),
    Option(
        "--tokenizer", E + "tokenizer", str, None,
        "the tokenizer, for a model folder without one: a folder with tokenizer.json, that "
        "file, or a GGUF file (default: the model's own)"
    ),
    Option(
        "--served-model-name", S + "served_model_names", str, "+",
        "name(s) clients use in `model` (default: the file or folder name, without a GGUF "
        "quantization tag such as .Q4_1)", to_field=tuple
    ),
    Option(
        "--cpu-threads", E + "cpu_threads", str, None,
        "CPU threads of the engine: N, or auto (default: the CPUs not busy with other "
        "processes at start)", to_field=parse_threads
    ),
    Option("--host", S + "host", str, None, "address to listen on (default 127.0.0.1)"),
    Option("--port", S + "port", int, None, "port (default 8000)"),
    Option("--device", E + "device", str, None, "cpu or cuda (default: cuda if present)"),
    Option(
        "--dtype", E + "dtype", str, None,
        "float32 | bfloat16 | float16 (default: float32 on cpu, bf16 on cuda)"
    ),
    Option(
        "--quantization", E + "quantization", str, None,
        "auto (the GGUF's own q8_0/q4_0/q4_1, default) | none (float32) | q8_0 | q4_0"
    ),
    Option(
        "--activations", E + "activations", str, None,
        "products of the quantized kernels: auto (int8 where the CPU has AVX512_VNNI or "
        "AVX2, else bfloat16 where it has AVX512_BF16; default) | float32 | bfloat16 | int8 "
        "(activations quantized to int8 per block of 32, integer products)"
    ),
    Option(
        "--batch-invariant", E + "batch_invariant", on_off, None,
        "on (default): a request's greedy output and logprobs do not depend on what shares its "
        "steps, how its prompt is chunked, prefix-cache hits, preemption or speculation (CPU "
        "kernels: one step path for every size, paged attention for every prompt); off: the "
        "step path measured fastest per size (docs/performance.md#same-request-same-answer)"
    ),
    Option(
        "--kv-cache-dtype", E + "kv_cache_dtype", str, None,
        "the KV cache's element type: auto (the model's dtype, default) | float32 | float16 | "
        "bfloat16 (fp16, bf16 too); a 16-bit cache holds twice the tokens in --kv-cache-gib "
        "and halves what decode attention reads: faster decode at long context"
    ),
    Option(
        "--policy", P + "name", str, None, "fcfs | strict | drr | wfq | hybrid (default hybrid)"
    ),
    Option(
        "--speculative-config", E + "speculative_config", str, None,
        "speculative decoding, vLLM's JSON keys: method (ngram | draft_model), model (the "
        "draft model's path), num_speculative_tokens, prompt_lookup_max, prompt_lookup_min; "
        "plus classes (default [0, 1]). Default off",
        to_field=parse_speculative_config,
    ),
    Option(
        "--speculative-model", E + "speculative_model", str, None,
        "a draft model (.gguf file or Hugging Face folder, same tokenizer as the served model) "
        "proposing the drafts; with --speculative-config its other keys apply. Default none",
    ),
    Option(
        "--max-num-seqs", E + "max_num_seqs", int, None,
        "most requests running at once (default 64)"
    ),
    Option(
        "--max-num-batched-tokens", E + "max_num_batched_tokens", int, None,
        "token budget per step (default 512 on cpu, 2048 on cuda)"
    ),
    Option(
        "--max-model-len", E + "max_model_len", int, None,
        "context length cap (default: the model's)"
    ),
    Option("--block-size", E + "block_size", int, None, "tokens per KV block (default 16)"),
    Option(
        "--kv-cache-gib", E + "kv_cache_gib", float, None,
        "KV cache memory budget in GiB (default: 1.0 on cpu; on cuda what "
        "--gpu-memory-utilization leaves)"
    ),
    Option(
        "--gpu-memory-utilization", E + "gpu_memory_utilization", float, None,
        "cuda: the share of the GPU's memory the engine may use; the KV cache takes what the "
        "weights and activations leave (0.9; --kv-cache-gib or --num-kv-blocks override it; "
        "no effect on cpu)"
    ),
    Option(
        "--num-kv-blocks", E + "num_kv_blocks", int, None,
        "KV cache size in blocks (overrides --kv-cache-gib)"
    ),
    Option(
        "--swap-space-gib", E + "swap_space_gib", float, None,
        "host swap space for preempted KV in GiB (default: 4 on cuda, 0 on cpu)"
    ),
    Option(
        "--preemption-mode", E + "preemption_mode", str, None,
        "auto | swap | recompute (default auto: by cost)"
    ),
    Option(
        "--swap-cost-ratio", E + "swap_cost_ratio", float, None,
        "auto swaps when swap < ratio x recompute (0.3)"
    ),
    Option(
        "--p0-floor-min", PART + "p0_floor_min", size, None,
        "P0 hard floor, lower bound (fraction or blocks; 0.02)"
    ),
    Option(
        "--p0-floor-max", PART + "p0_floor_max", size, None, "P0 hard floor, upper bound (0.10)"
    ),
    Option("--p0-ceiling", PART + "p0_ceiling", size, None, "most KV memory P0 may use (0.60)"),
    Option("--p1-reserve", PART + "p1_reserve", size, None, "P1 elastic reservation (0.20)"),
    Option(
        "--borrowers", PART + "borrowers", str, "+",
        "classes that may borrow the idle P1 reservation (p3)", to_field=_priorities
    ),
    Option(
        "--ttft-sla", "engine.priorities.ttft_sla_s", sla, 4,
        "TTFT SLA per class in seconds, 'none' for none (0.5 5 60 none)", to_field=tuple
    ),
    Option(
        "--drr-weights", P + "drr_weights", float, 4, "DRR weights P0..P3 (8 4 2 1)",
        to_field=tuple
    ),
    Option(
        "--wfq-weights", P + "wfq_weights", float, 4, "WFQ weights P0..P3 (16 8 4 2)",
        to_field=tuple
    ),
    Option(
        "--aging-thresholds", P + "aging_thresholds_s", sla, 4,
        "seconds before promotion P0..P3 (none 30 15 5)", to_field=tuple
    ),
    Option(
        "--sla-admission", ADM + "sla_admission", on_off, None,
        "on: refuse (503 + Retry-After) a request predicted to miss its class's TTFT SLA (off)",
        to_field=bool
    ),
    Option(
        "--sla-margin", ADM + "sla_margin", float, None,
        "SLA admission: admit while predicted TTFT <= margin x SLA (0.8)"
    ),
    Option(
        "--tenants", S + "tenants_file", str, None,
        "tenants file (YAML): keys, entitlements, rate limits"
    ),
    Option(
        "--api-key", S + "api_key", str, None,
        "single-key mode: require this Bearer key (default: $TIERSERVE_API_KEY)"
    ),
    Option(
        "--chat-template", S + "chat_template", str, None,
        "Jinja chat template file (or inline template) replacing the model's"
    ),
    Option(
        "--max-queued-requests", ADM + "max_queued_requests", int, 4,
        "queue limit per class P0..P3", to_field=tuple
    ),
    Option(
        "--max-queued-tokens", ADM + "max_queued_tokens", int, 4,
        "queued-token limit per class P0..P3", to_field=tuple
    ),
    Option(
        "--rate-limit", ADM + "global_bucket.rate", float, None,
        "global token bucket rate (prompt+max_tokens per second)"
    ),
    Option("--burst", ADM + "global_bucket.burst", float, None, "global token bucket burst"),
    Option(
        "--p0-rate-reserve", ADM + "p0_rate_reserve", float, None,
        "share of the global burst only P0 may draw; 0 = none (0.2)"
    ),
    Option(
        "--tenant-rate-limit", ADM + "tenant_bucket.rate", float, None,
        "default per-tenant bucket rate"
    ),
    Option(
        "--tenant-burst", ADM + "tenant_bucket.burst", float, None,
        "default per-tenant bucket burst"
    ),
    Option(
        "--default-max-tokens", S + "default_max_tokens", int, None,
        "max_tokens when a request gives none (512)"
    ),
    Option(
        "--max-request-bytes", S + "max_request_bytes", int, None,
        "largest accepted request body (4 MiB)"
    ),
    Option(
        "--shutdown-grace-s", S + "shutdown_grace_s", float, None,
        "on SIGTERM, seconds for in-flight requests (10)"
    ),
    Option(
        "--header-timeout-s", S + "header_timeout_s", float, None,
        "seconds a client has to send a request's headers (10)"
    ),
    Option(
        "--body-timeout-s", S + "body_timeout_s", float, None,
        "seconds a client has to send a request's body (60)"
    ),
    Option(
        "--max-connections", S + "max_connections", int, None,
        "open connections at most; more get 503 (1024)"
    ),
    Option("--seed", E + "seed", int, None, "sampler seed for unseeded requests"),
    Option(
        "--p0-express", E + "p0_express", str, None,
        "step built for a waiting P0: exclusive | decode | off "
        "(default: exclusive on cpu, decode on cuda)"
    ),
    _scheduler("--p0-cut-in", on_off, to_field=bool),
    _scheduler("--step-time-fraction", float_or_none, to_field=_none_word),
    _scheduler("--p0-step-time-fraction", float_or_none, to_field=_none_word),
    Option(
        "--predictive", E + "predictive", str, "+",
        "uses of the output-length predictor: off (default) | all | any of order (shortest "
        "predicted first in a class, 5 s aging bound), reserve, ttft, routing (the cluster "
        "ranks replicas by predicted KV)", to_field=parse_predictive,
    ),
    _scheduler("--p0-calm-fraction", float_or_none, to_field=_none_word),
    Option(
        "--prefix-retention", E + "prefix_retention", float, 4,
        "pools of later allocations a cached block of P0..P3 outlives beyond LRU; 0 0 0 0: "
        "LRU (4 2 1 0)", to_field=tuple
    ),
    Option("--log-level", S + "log_level", str, None, "debug | info | warning (info)"),
    Option(
        "--otlp-traces-endpoint", S + "otlp_traces_endpoint", str, None,
        "send one OpenTelemetry span per request (class, tenant, queue wait, prefill, decode, "
        "preemptions, outcome) over OTLP/HTTP to this collector URL, e.g. "
        "http://localhost:4318/v1/traces (vLLM's flag; needs tierserve[tracing])"
    ),
    Option(
        "--tensor-parallel-size", E + "tensor_parallel_size", int, None,
        "split the model across N processes of this host (N GPUs on cuda), one engine; "
        "KV sizes are per rank (default 1)", short="-tp"
    ),
    Option(
        "--replicas", C + "replicas", int, None,
        "serve N engine replicas on Ray Serve (default: one process)"
    ),
    Option(
        "--max-replicas", C + "max_replicas", int, None,
        "autoscale the engine replicas up to this many, by class"
    ),
    Option(
        "--ray-address", C + "ray_address", str, None,
        "join this Ray cluster instead of starting a local one"
    ),
    Option(
        "--router", C + "router", str, None,
        "replica router: priority-aware | least-loaded | ... (cluster)"
    ),
    Option(
        "--prefix-margin-tokens", C + "prefix_margin_tokens", int, None,
        "router: prefix affinity's load margin (4096)"
    ),
    Option(
        "--ingress-queue", C + "ingress_queue", on_off, None,
        "cluster: hold requests at the ingress until a replica has a free seat (off)"
    ),
    Option(
        "--batch-db", S + "batch_db", str, None,
        "Batch API database: an SQLite path or an SQLAlchemy URL; off: no Batch API "
        "(default: batch/batch.db in the cache dir)"
    ),
    Option(
        "--files-dir", S + "files_dir", str, None,
        "Batch API file bodies (default: batch/files in the cache dir)"
    ),
    Option(
        "--batch-window", S + "batch_window", int, None,
        "Batch API: lines in flight at once, overall and per batch (64)"
    ),
    _switch("--no-prefix-caching", E + "enable_prefix_caching", "disable prefix caching"),
    _switch(
        "--enforce-eager", E + "enforce_eager",
        "cuda: run every step eagerly, no decode graphs (vLLM's flag)", negate=False
    ),
    _switch(
        "--no-adaptive-floor", PART + "adaptive",
        "keep the P0 floor at its max instead of following P0 demand"
    ),
    _switch("--no-aging", P + "aging", "disable aging (promotion of long-waiting requests)"),
    _switch(
        "--no-tenant-fairness", P + "tenant_fairness",
        "disable per-tenant fairness inside a class"
    ),
    _switch(
        "--reject-on-sla-miss", ADM + "reject_on_sla_miss",
        "reject early requests whose class SLA cannot be met", negate=False
    ),
    _switch(
        "--no-shed", ADM + "shed_for_p0",
        "do not shed lower-class waiters when the P0 queue is full"
    ),
)
# fmt: on
