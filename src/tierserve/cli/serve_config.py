"""Every `tierserve serve` setting in one frozen tree, `ServeConfig` (in the manner of vLLM's
VllmConfig):

    ServeConfig
      engine: EngineArgs          model, device, dtype, KV cache, scheduler budgets, ...
        partitions: PartitionConfig   KV memory by class (P0 floor, P1 reserve, borrowers)
        policy: PolicyConfig          scheduling policy, weights, aging
        priorities: PriorityConfig    TTFT SLA by class
        admission: AdmissionConfig    queue limits, token buckets, SLA admission, shedding
      server: ServerSettings      host, port, keys, tenants, timeouts, Batch API
      cluster: ClusterOptions     Ray Serve replicas, router (None: one process)

The flags and the `--config` file are generated from one table (serve_options.OPTIONS) whose
`dest` names a place in this tree; `build_serve_config` fills the tree from the merged options,
and `resolve_defaults` (engine/args.py, re-exported here) is the one place where a default
depends on the device. Torch-free."""

from __future__ import annotations

import os
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from tierserve.admission.sla import policy_for_sla_admission
from tierserve.api.settings import ServerSettings
from tierserve.api.tenancy import API_KEY_ENV
from tierserve.cli.serve_model import served_name
from tierserve.cli.serve_options import OPTIONS
from tierserve.cluster.launch import ClusterOptions
from tierserve.config import (
    AdmissionConfig,
    BucketConfig,
    PartitionConfig,
    PolicyConfig,
    PriorityConfig,
)
from tierserve.engine.args import DEVICE_DEFAULTS, EngineArgs, resolve_defaults


@dataclass(frozen=True)
class ServeConfig:
    engine: EngineArgs = field(default_factory=EngineArgs)
    server: ServerSettings = field(default_factory=ServerSettings)
    cluster: ClusterOptions | None = None  # None: one process, no Ray


__all__ = [
    "DEVICE_DEFAULTS",
    "ServeConfig",
    "batch_settings",
    "build_serve_config",
    "destination_exists",
    "resolve_defaults",
]


def _section(values: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The fields directly under `prefix` ("engine.policy") among `values` (dest -> value)."""
    n = len(prefix) + 1
    return {k[n:]: v for k, v in values.items() if k.startswith(prefix + ".") and "." not in k[n:]}


def _bucket(values: dict[str, Any], prefix: str) -> BucketConfig | None:
    """A token bucket from its rate and burst (the burst defaults to the rate); None: no rate."""
    kw = _section(values, prefix)
    return BucketConfig(kw["rate"], kw.get("burst", kw["rate"])) if "rate" in kw else None


def batch_settings(srv: dict) -> dict:
    """The Batch API's settings: on by default, with its database and files in the cache dir."""
    from tierserve.host.paths import cache_dir

    db = srv.get("batch_db") or str(cache_dir() / "batch" / "batch.db")
    if db.lower() in ("off", "none"):
        return {"batch_db": None}
    out = {"batch_db": db, "files_dir": srv.get("files_dir")}
    if srv.get("batch_window") is not None:
        if srv["batch_window"] < 1:
            raise ValueError(f"--batch-window must be at least 1, got {srv['batch_window']}")
        out["batch_window"] = srv["batch_window"]
    return out


def _engine(values: dict[str, Any]) -> EngineArgs:
    admission = AdmissionConfig(
        **_section(values, "engine.admission"),
        global_bucket=_bucket(values, "engine.admission.global_bucket"),
        tenant_bucket=_bucket(values, "engine.admission.tenant_bucket"),
    )
    policy = PolicyConfig(**_section(values, "engine.policy"))
    return EngineArgs(
        **_section(values, "engine"),
        partitions=PartitionConfig(**_section(values, "engine.partitions")),
        policy=policy_for_sla_admission(policy) if admission.sla_admission else policy,
        priorities=PriorityConfig(**_section(values, "engine.priorities")),
        admission=admission,
    )


def _server(values: dict[str, Any]) -> ServerSettings:
    kw = _section(values, "server")
    kw.update(batch_settings(kw))
    if not kw.get("served_model_names"):
        kw["served_model_names"] = (served_name(values.get("engine.model")),)
    if kw.get("api_key") is None and os.environ.get(API_KEY_ENV):
        kw["api_key"] = os.environ[API_KEY_ENV]  # the flag (or the config file) wins
    return ServerSettings(**kw)


def _cluster(values: dict[str, Any]) -> ClusterOptions | None:
    kw = {k: v for k, v in _section(values, "cluster").items() if v is not None}
    if "replicas" not in kw and "ray_address" not in kw:
        return None
    return ClusterOptions(**{"replicas": 1, **kw})


def build_serve_config(opts: dict) -> ServeConfig:
    """The tree from merged options (flag names underscored, vLLM's already turned into ours):
    each option's value, converted by its `to_field`, lands at its `dest`."""
    values: dict[str, Any] = {}
    for opt in OPTIONS:
        if opt.dest is not None and opt.key in opts:
            value = opts[opt.key]
            values[opt.dest] = opt.to_field(value) if opt.to_field else value
    return ServeConfig(engine=_engine(values), server=_server(values), cluster=_cluster(values))


def _dataclass_in(annotation: Any) -> type | None:
    if is_dataclass(annotation):
        return annotation
    for arg in typing.get_args(annotation):
        if (found := _dataclass_in(arg)) is not None:
            return found
    return None


def destination_exists(dest: str) -> bool:
    """Whether "section.field..." names a field of the ServeConfig tree."""
    cls: type | None = ServeConfig
    for part in dest.split("."):
        if cls is None or part not in {f.name for f in fields(cls)}:
            return False
        cls = _dataclass_in(typing.get_type_hints(cls)[part])
    return True
