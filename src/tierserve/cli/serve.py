"""`tierserve serve` options: a flag for every engine, cache, policy and server setting (named as
vLLM users know them where one exists), and `--config FILE` (YAML, same names with underscores)
for all of them at once. Explicit flags override the file; the file overrides the defaults.

Both are generated from one table, `serve_options.OPTIONS`, whose entries name where their value
goes in the `ServeConfig` tree (serve_config.py). The file is validated by a pydantic model built
from that table (`ServeConfigFile`): strict types (`no_aging: "false"` is an error, not True),
lists where the flag takes several values, and an unknown key is an error that suggests the
closest known one. CLI-only: `--config` itself and vLLM's positional MODEL (`CLI_ONLY`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, create_model

from tierserve.api.settings import ServerSettings
from tierserve.cli.serve_config import build_serve_config
from tierserve.cli.serve_model import check_model_source
from tierserve.cli.serve_options import OPTIONS, float_or_none, on_off, size, sla
from tierserve.cli.serve_vllm import (
    VLLM_OPTIONS,
    VLLM_SWITCHES,
    add_vllm_arguments,
    apply_vllm_options,
    check_policy_name,
)
from tierserve.config_file import ConfigFileError, FileModel, read_yaml, validate_file
from tierserve.engine.args import EngineArgs

NOTES = "_notes"  # merged_options' key for the lines to log at start
CLI_ONLY = ("config", "model_tag")  # destinations of serve's flags that are no file key


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


def _file_fields() -> dict[str, tuple]:
    out = {o.key: ((bool if o.switch else _file_type(o.type, o.nargs)), None) for o in OPTIONS}
    for flag, typ, _ in VLLM_OPTIONS:
        out[flag[2:].replace("-", "_")] = (_file_type(typ, None), None)
    for flag, _ in VLLM_SWITCHES:
        out[flag[2:].replace("-", "_")] = (bool, None)
    return out


ServeConfigFile = create_model("ServeConfigFile", __base__=FileModel, **_file_fields())
# A file key's (type, nargs) for conversion as its flag's; switches convert as booleans.
_TYPES = {o.key: (o.type, o.nargs) for o in OPTIONS if not o.switch}
_TYPES |= {flag[2:].replace("-", "_"): (typ, None) for flag, typ, _ in VLLM_OPTIONS}


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
    opts: dict = {}
    for key in cfg.model_fields_set:
        v = getattr(cfg, key)
        if key not in _TYPES:  # a switch
            opts[key] = v
            continue
        typ, nargs = _TYPES[key]
        if nargs is None:
            opts[key] = typ(v)
        else:
            opts[key] = [typ(x) for x in (v if isinstance(v, list) else [v])]
    return _paths_from(Path(path).expanduser().resolve().parent, opts)


# A config file's keys that name files: a relative one is read from the file's own folder (so
# `--config /etc/tierserve/config.yaml` finds `tenants: tenants.yaml` beside it from anywhere).
PATH_KEYS = ("model", "tokenizer", "speculative_model", "tenants", "chat_template", "files_dir",
             "batch_db")  # fmt: skip


def _paths_from(folder: Path, opts: dict) -> dict:
    for key in PATH_KEYS:
        value = opts.get(key)
        if not isinstance(value, str) or value in ("off", "") or "://" in value:
            continue  # (--batch-db off, or an SQLAlchemy URL)
        if key == "chat_template" and "{" in value:
            continue  # (a template given inline)
        p = Path(value).expanduser()
        if not p.is_absolute():
            opts[key] = str(folder / p)
    return opts


# `serve --help` in groups, in this order (vLLM's: the model, then the server, ...); every
# option is in exactly one (tests/test_serve_cli.py).
GROUPS: dict[str, tuple[str, ...]] = {
    "model and precision": (
        "--model", "--tokenizer", "--served-model-name", "--device", "--dtype", "--quantization",
        "--activations", "--batch-invariant", "--chat-template", "--seed",
    ),
    "server": (
        "--host", "--port", "--api-key", "--tenants", "--default-max-tokens",
        "--max-request-bytes", "--shutdown-grace-s", "--header-timeout-s", "--body-timeout-s",
        "--max-connections", "--cpu-threads", "--enforce-eager",
    ),
    "memory and the KV cache": (
        "--max-model-len", "--block-size", "--kv-cache-gib", "--gpu-memory-utilization",
        "--num-kv-blocks", "--kv-cache-dtype", "--swap-space-gib", "--no-prefix-caching",
        "--prefix-retention", "--p0-floor-min", "--p0-floor-max", "--p0-ceiling", "--p1-reserve",
        "--borrowers", "--no-adaptive-floor",
    ),
    "scheduling and classes": (
        "--policy", "--max-num-seqs", "--max-num-batched-tokens", "--ttft-sla", "--drr-weights",
        "--wfq-weights", "--aging-thresholds", "--no-aging", "--no-tenant-fairness",
        "--preemption-mode", "--swap-cost-ratio", "--p0-express", "--p0-cut-in",
        "--step-time-fraction", "--p0-step-time-fraction", "--p0-calm-fraction",
    ),
    "admission": (
        "--sla-admission", "--sla-margin", "--reject-on-sla-miss", "--max-queued-requests",
        "--max-queued-tokens", "--rate-limit", "--burst", "--p0-rate-reserve",
        "--tenant-rate-limit", "--tenant-burst", "--no-shed",
    ),
    "speculation and prediction": ("--speculative-config", "--speculative-model", "--predictive"),
    "scale-out": (
        "--tensor-parallel-size", "--replicas", "--max-replicas", "--ray-address", "--router",
        "--prefix-margin-tokens", "--ingress-queue",
    ),
    "batch API": ("--batch-db", "--files-dir", "--batch-window"),
    "observability": ("--log-level", "--otlp-traces-endpoint"),
}  # fmt: skip


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML file with any of these settings (underscored names)")
    by_flag = {o.flag: o for o in OPTIONS}
    for title, flags in GROUPS.items():
        g = p.add_argument_group(title)
        for flag in flags:
            o = by_flag[flag]
            names = [o.flag, o.short] if o.short else [o.flag]
            if o.switch:
                g.add_argument(*names, action="store_true", default=None, help=o.help)
            else:
                g.add_argument(*names, type=o.type, nargs=o.nargs, default=None, help=o.help)
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
    check_model_source(opts.get("model"), opts.get("tokenizer"))
    return opts


def build_configs(opts: dict) -> tuple[EngineArgs, ServerSettings]:
    """The engine's and the server's settings (`build_serve_config`'s tree, less the cluster)."""
    tree = build_serve_config(opts)
    return tree.engine, tree.server
