"""What machine a fitted cost profile describes: CPU model, instruction-set extensions, CPU
count, threads and torch version. Read without importing torch, so `simulate` can compare the
machine it runs on with the one a profile was fitted on.

A CPU profile fitted on one machine can be far off on another: on an AVX2-only CPU the shipped
profile (fitted on an AVX-512 one) missed real throughput by half. The compared fields are the
ones that change kernel speed: CPU model, instruction sets, logical CPUs and torch version.
"""

from __future__ import annotations

import os
import platform
from importlib import metadata
from pathlib import Path

# Extensions that decide which kernels torch runs (x86 and Arm), in a stable order.
ISA_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "sve",
    "sve2",
    "bf16",
    "i8mm",
)
COMPARED = {
    "cpu_model": "CPU model",
    "isa": "instruction sets",
    "logical_cpus": "CPU count",
    "torch": "torch version",
}


def _cpuinfo(path: Path = Path("/proc/cpuinfo")) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _field(info: str, *names: str) -> str | None:
    for line in info.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in names and value.strip():
            return value.strip()
    return None


def machine_fingerprint(threads: int | None = None, cpuinfo: str | None = None) -> dict:
    """This machine, as recorded in a fitted profile's ``fitted_on``. `threads`: the torch
    threads the fit ran with (only the caller that imported torch knows)."""
    info = _cpuinfo() if cpuinfo is None else cpuinfo
    flags = set((_field(info, "flags", "Features") or "").split())
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    return {
        "cpu_model": _field(info, "model name", "Model name", "Hardware")
        or platform.processor()
        or platform.machine(),
        "isa": [f for f in ISA_FLAGS if f in flags],
        "logical_cpus": os.cpu_count(),
        "threads": threads,
        "torch": torch_version,
    }


def describe(fp: dict) -> str:
    isa = "+".join(fp.get("isa") or []) or "no listed extensions"
    threads = f", {fp['threads']} threads" if fp.get("threads") else ""
    return (
        f"{fp.get('cpu_model')} ({isa}), {fp.get('logical_cpus')} CPUs{threads}, "
        f"torch {fp.get('torch')}"
    )


def differences(fitted: dict, here: dict) -> list[str]:
    """The compared fields on which two fingerprints differ, in words."""
    out = []
    for key, words in COMPARED.items():
        a, b = fitted.get(key), here.get(key)
        if a == b:
            continue
        if key == "isa":
            lost = [f for f in a or [] if f not in (b or [])]
            new = [f for f in b or [] if f not in (a or [])]
            parts = ([f"here lacks {', '.join(lost)}"] if lost else []) + (
                [f"here adds {', '.join(new)}"] if new else []
            )
            out.append(f"{words}: {'; '.join(parts)}")
        else:
            out.append(f"{words}: {a} there, {b} here")
    return out
