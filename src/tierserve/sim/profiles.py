"""Hardware and model profiles, shipped as JSON data in ``sim/profiles/``. A name finds a
shipped profile; a path to a .json file loads that file."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path

from tierserve.model.config import ModelConfig


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    # "roofline": step time = max(compute, memory) (GPUs overlap the two);
    # "additive": compute + memory (fitted on a CPU, where they do not overlap well).
    mode: str
    peak_flops: float  # per device, at the model's dtype
    mem_bandwidth: float  # bytes/s per device
    memory_bytes: float  # per device
    compute_efficiency: float
    attention_efficiency: float
    memory_efficiency: float
    allreduce_bus_bandwidth: float  # bytes/s, NCCL bus bandwidth
    allreduce_latency_s: float
    pcie_bandwidth: float  # host <-> device, bytes/s per device
    step_overhead_s: float
    per_seq_overhead_s: float
    activation_headroom_bytes: float
    description: str = ""
    # Reading KV of scattered blocks can run at another rate than streaming weights; default
    # (None): the same as memory_efficiency.
    kv_memory_efficiency: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("roofline", "additive"):
            raise ValueError(f"{self.name}: mode must be roofline or additive, got {self.mode!r}")
        for f in (
            "peak_flops",
            "mem_bandwidth",
            "pcie_bandwidth",
            "compute_efficiency",
            "memory_efficiency",
            "attention_efficiency",
        ):
            if getattr(self, f) <= 0:
                raise ValueError(f"{self.name}: {f} must be positive")


@dataclass(frozen=True)
class ModelProfile:
    config: ModelConfig
    dtype_bytes: int

    @property
    def name(self) -> str:
        return self.config.name


def user_profile_dir() -> Path:
    """Where `tierserve calibrate` writes by default; found before the shipped profiles."""
    from tierserve.model.loader import cache_dir

    return cache_dir() / "profiles"


def _read(name_or_path: str) -> dict:
    p = Path(name_or_path)
    if p.suffix == ".json" and p.exists():
        return json.loads(p.read_text())
    mine = user_profile_dir() / f"{name_or_path}.json"
    if mine.exists():
        return json.loads(mine.read_text())
    try:
        text = resources.files("tierserve.sim").joinpath("profiles", f"{name_or_path}.json")
        return json.loads(text.read_text())
    except FileNotFoundError:
        raise ValueError(
            f"unknown profile {name_or_path!r}; shipped: {', '.join(shipped_profiles())}"
        ) from None


def shipped_profiles() -> list[str]:
    folder = resources.files("tierserve.sim").joinpath("profiles")
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def load_hardware(name_or_path: str) -> HardwareProfile:
    d = _read(name_or_path)
    if d.get("kind") != "hardware":
        raise ValueError(f"{name_or_path} is not a hardware profile")
    known = {f.name for f in fields(HardwareProfile)}
    return HardwareProfile(**{k: v for k, v in d.items() if k in known})


def load_model_profile(name_or_path: str) -> ModelProfile:
    d = _read(name_or_path)
    if d.get("kind") != "model":
        raise ValueError(f"{name_or_path} is not a model profile")
    dtype_bytes = int(d.get("dtype_bytes", 2))
    keys = (
        "architecture",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "tie_word_embeddings",
        "name",
    )
    return ModelProfile(ModelConfig(**{k: d[k] for k in keys if k in d}), dtype_bytes)
