"""Hardware and model profiles, shipped as JSON data in ``sim/profiles/``. A path to a .json
file loads that file; a name finds the user's profile of that name in
``$TIERSERVE_CACHE_DIR/profiles`` (where `tierserve calibrate` writes) first, then the shipped
one. A user's profile taking precedence is never silent: it is logged, and ``profile_notes``
(printed by `simulate` and `sim-fidelity`) names the file. A fitted profile records the machine
it was fitted on (``fitted_on``, see machine.py); ``profile_notes`` warns when this machine
differs, or when that was not recorded.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, fields
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from tierserve.host.machine import describe, differences, machine_fingerprint
from tierserve.host.paths import cache_dir
from tierserve.model.config import ModelConfig

log = logging.getLogger(__name__)


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
    return cache_dir() / "profiles"


def locate(name_or_path: str) -> tuple[Path | Traversable, str]:
    """The file a profile name or path resolves to, and where it came from: "file" (a path),
    "user" (the user's profile folder, which takes precedence) or "shipped"."""
    p = Path(name_or_path)
    if p.suffix == ".json" and p.exists():
        return p, "file"
    mine = user_profile_dir() / f"{name_or_path}.json"
    if mine.exists():
        return mine, "user"
    shipped = resources.files("tierserve.sim").joinpath("profiles", f"{name_or_path}.json")
    if shipped.is_file():
        return shipped, "shipped"
    raise ValueError(f"unknown profile {name_or_path!r}; shipped: {', '.join(shipped_profiles())}")


def _read(name_or_path: str) -> dict:
    path, origin = locate(name_or_path)
    if origin == "user":
        log.info("profile %r: using your calibrated %s over the shipped one", name_or_path, path)
    return json.loads(path.read_text())


def profile_notes(name_or_path: str, here: dict | None = None) -> list[str]:
    """Lines to show the user before a run with this profile: which file a name resolved to when
    it is the user's own, and whether a fitted profile describes this machine (`here`, default
    this machine's fingerprint)."""
    path, origin = locate(name_or_path)
    d = json.loads(path.read_text())
    notes = []
    if origin == "user":
        notes.append(
            f"note: profile {name_or_path!r} is your calibrated {path} (it takes precedence over "
            "the shipped one)"
        )
    if "fit" not in d:  # a datasheet profile: nothing was measured on a machine
        return notes
    here = machine_fingerprint() if here is None else here
    fitted = d.get("fitted_on")
    fix = "run `tierserve calibrate` to fit a profile for this machine."
    if fitted is None:
        notes.append(
            f"warning: profile {name_or_path!r} ({path}) was fitted on an unrecorded machine; "
            f"its step times may not hold on this one ({describe(here)}): {fix}"
        )
    elif diffs := differences(fitted, here):
        notes.append(
            f"warning: profile {name_or_path!r} ({path}) was fitted on {describe(fitted)}; this "
            f"machine differs ({'; '.join(diffs)}): {fix}"
        )
    return notes


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


def simulated_note(hardware: str) -> str:
    """The line every simulated report carries: these figures come from a cost model, and what
    that model rests on (a datasheet profile's assumed efficiencies, or a fit's machine)."""
    head = "**Simulated, not measured**: step times come from the cost model of profile"
    try:
        path, _ = locate(hardware)
        d = json.loads(path.read_text())
    except (ValueError, OSError):
        return f"{head} {hardware!r}."
    if "fit" in d:
        where = describe(d["fitted_on"]) if d.get("fitted_on") else "an unrecorded machine"
        return f"{head} {hardware!r}, fitted on {where}."
    eff = ", ".join(
        f"{k.removesuffix('_efficiency')} {d[k]:g}"
        for k in ("compute_efficiency", "attention_efficiency", "memory_efficiency")
        if k in d
    )
    return (
        f"{head} {hardware!r}: spec-sheet peaks with **assumed** efficiencies ({eff}), not "
        "measured on that hardware (docs/gpu-profile.md)."
    )
