"""`tierserve serve` options: a flag for every engine, cache, policy and server setting (named as
vLLM users know them where one exists), and `--config FILE` (YAML, same names with underscores)
for all of them at once. Explicit flags override the file; the file overrides the defaults.

The file is validated by a pydantic model built from the same table (`ServeConfigFile`): strict
types (`no_aging: "false"` is an error, not True), lists where the flag takes several values,
and an unknown key is an error that suggests the closest known one."""

from __future__ import annotations

import argparse
import os
from typing import Annotated, Any, Literal

from pydantic import Field, create_model

from tierserve.admission.sla import policy_for_sla_admission
from tierserve.api.settings import ServerSettings
from tierserve.api.tenancy import API_KEY_ENV
from tierserve.config import (
    AdmissionConfig,
    BucketConfig,
    PartitionConfig,
    PolicyConfig,
    PriorityConfig,
)
from tierserve.config_file import ConfigFileError, FileModel, read_yaml, validate_file
from tierserve.cpu_threads import parse_threads
from tierserve.engine.args import EngineArgs
from tierserve.priority import parse_priority
from tierserve.serve_model import check_model_source, served_name
from tierserve.serve_vllm import (
    VLLM_OPTIONS,
    VLLM_SWITCHES,
    add_vllm_arguments,
    apply_vllm_options,
    check_policy_name,
)

NOTES = "_notes"  # merged_options' key for the lines to log at start


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


# (flag, type, nargs, help); every default is None so that the config file can fill it in.
OPTIONS = [
    ("--model", str, None, "GGUF file or Hugging Face folder (default: embedded SmolLM2-135M)"),
    (
        "--served-model-name",
        str,
        "+",
        "name(s) clients use in `model` (default: the file or folder name, without a GGUF "
        "quantization tag such as .Q4_1)",
    ),
    (
        "--cpu-threads",
        str,
        None,
        "CPU threads of the engine: N, or auto (default: the CPUs not busy with other "
        "processes at start)",
    ),
    ("--host", str, None, "address to listen on (default 127.0.0.1)"),
    ("--port", int, None, "port (default 8000)"),
    ("--device", str, None, "cpu or cuda (default: cuda if present)"),
    ("--dtype", str, None, "float32 | bfloat16 | float16 (default: float32 on cpu, bf16 on cuda)"),
    (
        "--quantization",
        str,
        None,
        "auto (the GGUF's own q8_0/q4_0/q4_1, default) | none (float32) | q8_0 | q4_0",
    ),
    (
        "--activations",
        str,
        None,
        "products of the quantized kernels: auto (bfloat16 where the CPU has AVX512_BF16, "
        "default) | float32 | bfloat16",
    ),
    ("--policy", str, None, "fcfs | strict | drr | wfq | hybrid (default hybrid)"),
    ("--max-num-seqs", int, None, "most requests running at once (default 64)"),
    (
        "--max-num-batched-tokens",
        int,
        None,
        "token budget per step (default 512 on cpu, 2048 on cuda)",
    ),
    ("--max-model-len", int, None, "context length cap (default: the model's)"),
    ("--block-size", int, None, "tokens per KV block (default 16)"),
    ("--kv-cache-gib", float, None, "KV cache memory budget in GiB (default 1.0)"),
    ("--num-kv-blocks", int, None, "KV cache size in blocks (overrides --kv-cache-gib)"),
    (
        "--swap-space-gib",
        float,
        None,
        "host swap space for preempted KV in GiB (default: 4 on cuda, 0 on cpu)",
    ),
    ("--preemption-mode", str, None, "auto | swap | recompute (default auto: by cost)"),
    ("--swap-cost-ratio", float, None, "auto swaps when swap < ratio x recompute (0.3)"),
    ("--p0-floor-min", size, None, "P0 hard floor, lower bound (fraction or blocks; 0.02)"),
    ("--p0-floor-max", size, None, "P0 hard floor, upper bound (0.10)"),
    ("--p0-ceiling", size, None, "most KV memory P0 may use (0.60)"),
    ("--p1-reserve", size, None, "P1 elastic reservation (0.20)"),
    ("--borrowers", str, "+", "classes that may borrow the idle P1 reservation (p3)"),
    ("--ttft-sla", sla, 4, "TTFT SLA per class in seconds, 'none' for none (0.5 5 60 none)"),
    ("--drr-weights", float, 4, "DRR weights P0..P3 (8 4 2 1)"),
    ("--wfq-weights", float, 4, "WFQ weights P0..P3 (16 8 4 2)"),
    ("--aging-thresholds", sla, 4, "seconds before promotion P0..P3 (none 30 15 5)"),
    (
        "--sla-admission",
        on_off,
        None,
        "on: refuse (503 + Retry-After) a request predicted to miss its class's TTFT SLA (off)",
    ),
    (
        "--sla-margin",
        float,
        None,
        "SLA admission: admit while predicted TTFT <= margin x SLA (0.8)",
    ),
    ("--tenants", str, None, "tenants file (YAML): keys, entitlements, rate limits"),
    (
        "--api-key",
        str,
        None,
        "single-key mode: require this Bearer key (default: $TIERSERVE_API_KEY)",
    ),
    (
        "--chat-template",
        str,
        None,
        "Jinja chat template file (or inline template) replacing the model's",
    ),
    ("--max-queued-requests", int, 4, "queue limit per class P0..P3"),
    ("--max-queued-tokens", int, 4, "queued-token limit per class P0..P3"),
    ("--rate-limit", float, None, "global token bucket rate (prompt+max_tokens per second)"),
    ("--burst", float, None, "global token bucket burst"),
    (
        "--p0-rate-reserve",
        float,
        None,
        "share of the global burst only P0 may draw; 0 = none (0.2)",
    ),
    ("--tenant-rate-limit", float, None, "default per-tenant bucket rate"),
    ("--tenant-burst", float, None, "default per-tenant bucket burst"),
    ("--default-max-tokens", int, None, "max_tokens when a request gives none (512)"),
    ("--max-request-bytes", int, None, "largest accepted request body (4 MiB)"),
    ("--shutdown-grace-s", float, None, "on SIGTERM, seconds for in-flight requests (10)"),
    ("--header-timeout-s", float, None, "seconds a client has to send a request's headers (10)"),
    ("--body-timeout-s", float, None, "seconds a client has to send a request's body (60)"),
    ("--max-connections", int, None, "open connections at most; more get 503 (1024)"),
    ("--seed", int, None, "sampler seed for unseeded requests"),
    (
        "--p0-express",
        str,
        None,
        "step built for a waiting P0: exclusive | decode | off "
        "(default: exclusive on cpu, decode on cuda)",
    ),
    (
        "--step-time-fraction",
        float_or_none,
        None,
        "size each step's prefill to end within this fraction of P0's TTFT SLA; none: by "
        "tokens only (0.4)",
    ),
    (
        "--prefix-retention",
        float,
        4,
        "pools of later allocations a cached block of P0..P3 outlives beyond LRU; 0 0 0 0: "
        "LRU (1 0.5 0.25 0)",
    ),
    ("--log-level", str, None, "debug | info | warning (info)"),
    ("--replicas", int, None, "serve N engine replicas on Ray Serve (default: one process)"),
    ("--max-replicas", int, None, "autoscale the engine replicas up to this many, by class"),
    ("--ray-address", str, None, "join this Ray cluster instead of starting a local one"),
    ("--router", str, None, "replica router: priority-aware | least-loaded | ... (cluster)"),
    ("--prefix-margin-tokens", int, None, "router: prefix affinity's load margin (4096)"),
    (
        "--batch-db",
        str,
        None,
        "Batch API database: an SQLite path or an SQLAlchemy URL; off: no Batch API "
        "(default: batch/batch.db in the cache dir)",
    ),
    ("--files-dir", str, None, "Batch API file bodies (default: batch/files in the cache dir)"),
    ("--batch-window", int, None, "Batch API: lines in flight at once, overall and per batch (64)"),
]
SWITCHES = [
    ("--no-prefix-caching", "disable prefix caching"),
    ("--no-adaptive-floor", "keep the P0 floor at its max instead of following P0 demand"),
    ("--no-aging", "disable aging (promotion of long-waiting requests)"),
    ("--no-tenant-fairness", "disable per-tenant fairness inside a class"),
    ("--reject-on-sla-miss", "reject early requests whose class SLA cannot be met"),
    ("--no-shed", "do not shed lower-class waiters when the P0 queue is full"),
]


def _file_type(typ, nargs) -> Any:
    """The YAML type of a flag: its value type (strict), a list of 4 for per-class flags, one
    value or a list for the `nargs="+"` ones."""
    one = {
        size: int | float,
        sla: float | None | Literal["none", "None", "-"],
        on_off: bool | Literal["on", "off"],
        float_or_none: float | Literal["none", "null", "-"],
    }.get(typ, typ)
    if nargs is None:
        return one
    if nargs == "+":
        return one | Annotated[list[one], Field(min_length=1)]
    return Annotated[list[one], Field(min_length=nargs, max_length=nargs)]


def _setting_name(flag: str) -> str:
    return flag[2:].replace("-", "_")


ServeConfigFile = create_model(
    "ServeConfigFile",
    __base__=FileModel,
    **{_setting_name(f): (_file_type(t, n), None) for f, t, n, _ in OPTIONS},
    **{_setting_name(f): (bool, None) for f, _ in SWITCHES},
    **{_setting_name(f): (_file_type(t, None), None) for f, t, _ in VLLM_OPTIONS},
    **{_setting_name(f): (bool, None) for f, _ in VLLM_SWITCHES},
)


def read_config_file(path: str) -> dict:
    """The settings in a `--config` file, converted as their flags would be."""
    data = read_yaml(path, "config file")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigFileError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    named: dict = {}
    for k, v in data.items():
        key = str(k).replace("-", "_")
        if key in named:
            raise ConfigFileError(f"{path}: setting {key!r} is given twice")
        named[key] = v
    cfg = validate_file(ServeConfigFile, named, path, lambda loc: f"setting {loc[0]!r}")
    types = {_setting_name(f[0]): (f[1], f[2]) for f in OPTIONS}
    types |= {_setting_name(f): (t, None) for f, t, _ in VLLM_OPTIONS}
    opts: dict = {}
    for key in cfg.model_fields_set:
        v = getattr(cfg, key)
        if key not in types:  # a switch
            opts[key] = v
            continue
        typ, nargs = types[key]
        if nargs is None:
            opts[key] = typ(v)
        else:
            opts[key] = [typ(x) for x in (v if isinstance(v, list) else [v])]
    return opts


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML file with any of these settings (underscored names)")
    for flag, typ, nargs, text in OPTIONS:
        p.add_argument(flag, type=typ, nargs=nargs, default=None, help=text)
    for flag, text in SWITCHES:
        p.add_argument(flag, action="store_true", default=None, help=text)
    add_vllm_arguments(p)


def merged_options(ns: argparse.Namespace) -> dict:
    """Flags over the config file, vLLM's names turned into ours (`NOTES`: what to log at
    start), and what can be checked before the model loads."""
    opts = read_config_file(ns.config) if ns.config else {}
    for k, v in vars(ns).items():
        if v is not None and k not in ("config", "func", "command"):
            opts[k] = v
    opts[NOTES] = apply_vllm_options(opts)
    check_policy_name(opts.get("policy"))
    check_model_source(opts.get("model"))
    return opts


def batch_settings(opts: dict) -> dict:
    """The Batch API's settings: on by default, with its database and files in the cache dir."""
    from tierserve.paths import cache_dir

    db = opts.get("batch_db") or str(cache_dir() / "batch" / "batch.db")
    if db.lower() in ("off", "none"):
        return {"batch_db": None}
    out = {"batch_db": db, "files_dir": opts.get("files_dir")}
    if opts.get("batch_window") is not None:
        if opts["batch_window"] < 1:
            raise ValueError(f"--batch-window must be at least 1, got {opts['batch_window']}")
        out["batch_window"] = opts["batch_window"]
    return out


def build_configs(opts: dict) -> tuple[EngineArgs, ServerSettings]:
    def pick(obj_defaults, mapping: dict) -> dict:
        return {field: opts[key] for key, field in mapping.items() if key in opts}

    part_kw = pick(
        PartitionConfig,
        {k: k for k in ("p0_floor_min", "p0_floor_max", "p0_ceiling", "p1_reserve")},
    )
    if "borrowers" in opts:
        part_kw["borrowers"] = tuple(parse_priority(b) for b in opts["borrowers"])
    if opts.get("no_adaptive_floor"):
        part_kw["adaptive"] = False
    pol_kw = {"name": opts.get("policy", "hybrid")}
    for key, field in (
        ("drr_weights", "drr_weights"),
        ("wfq_weights", "wfq_weights"),
        ("aging_thresholds", "aging_thresholds_s"),
    ):
        if key in opts:
            pol_kw[field] = tuple(opts[key])
    pol_kw["aging"] = not opts.get("no_aging", False)
    pol_kw["tenant_fairness"] = not opts.get("no_tenant_fairness", False)
    adm_kw: dict = {}
    if "rate_limit" in opts:
        adm_kw["global_bucket"] = BucketConfig(
            opts["rate_limit"], opts.get("burst", opts["rate_limit"])
        )
    if "tenant_rate_limit" in opts:
        r = opts["tenant_rate_limit"]
        adm_kw["tenant_bucket"] = BucketConfig(r, opts.get("tenant_burst", r))
    for key in ("max_queued_requests", "max_queued_tokens"):
        if key in opts:
            adm_kw[key] = tuple(opts[key])
    if "p0_rate_reserve" in opts:
        adm_kw["p0_rate_reserve"] = opts["p0_rate_reserve"]
    adm_kw["reject_on_sla_miss"] = bool(opts.get("reject_on_sla_miss", False))
    adm_kw["sla_admission"] = bool(opts.get("sla_admission", False))
    if "sla_margin" in opts:
        adm_kw["sla_margin"] = opts["sla_margin"]
    adm_kw["shed_for_p0"] = not opts.get("no_shed", False)
    prio_kw = {"ttft_sla_s": tuple(opts["ttft_sla"])} if "ttft_sla" in opts else {}
    eng_kw = {
        k: opts[k]
        for k in (
            "model",
            "device",
            "dtype",
            "quantization",
            "activations",
            "kv_cache_gib",
            "num_kv_blocks",
            "swap_space_gib",
            "block_size",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "preemption_mode",
            "swap_cost_ratio",
            "seed",
        )
        if k in opts
    }
    eng_kw["cpu_threads"] = parse_threads(opts.get("cpu_threads"))
    if "step_time_fraction" in opts:
        f = opts["step_time_fraction"]
        eng_kw["step_time_fraction"] = None if f == "none" else f
    if "prefix_retention" in opts:
        eng_kw["prefix_retention"] = tuple(opts["prefix_retention"])
    policy = PolicyConfig(**pol_kw)
    args = EngineArgs(
        **eng_kw,
        enable_prefix_caching=not opts.get("no_prefix_caching", False),
        p0_express=opts.get("p0_express"),
        partitions=PartitionConfig(**part_kw),
        policy=policy_for_sla_admission(policy) if adm_kw["sla_admission"] else policy,
        priorities=PriorityConfig(**prio_kw),
        admission=AdmissionConfig(**adm_kw),
    )
    names = opts.get("served_model_name") or [served_name(opts.get("model"))]
    server_keys = (
        "host",
        "port",
        "default_max_tokens",
        "max_request_bytes",
        "shutdown_grace_s",
        "header_timeout_s",
        "body_timeout_s",
        "max_connections",
        "log_level",
        "api_key",
        "chat_template",
    )
    srv_kw = {k: opts[k] for k in server_keys if k in opts}
    srv_kw.update(batch_settings(opts))
    if srv_kw.get("api_key") is None and os.environ.get(API_KEY_ENV):
        srv_kw["api_key"] = os.environ[API_KEY_ENV]  # the flag (or the config file) wins
    settings = ServerSettings(
        **srv_kw, served_model_names=tuple(names), tenants_file=opts.get("tenants")
    )
    return args, settings
