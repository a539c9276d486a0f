"""Compile tierserve's C++ CPU kernels for the machine at hand, once, into the environment.

``python -m tierserve.kernels.build`` (run by ``make setup``) compiles ``csrc/*.cpp`` with
``-O3 -march=native -ffp-contract=off -fopenmp`` through ``torch.utils.cpp_extension`` (ninja,
from the ``ninja`` package) into ``<sys.prefix>/tierserve-kernels/<key>/``, where the key hashes the
sources, the flags, the torch version and this CPU's feature flags: a checkout moved to a
machine with another instruction set, or edited sources, get a fresh build rather than a stale
or illegal one. At run time `load_prebuilt` imports that library without a compiler.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import shutil
import sys
import time
from pathlib import Path
from types import ModuleType

import torch

NAME = "tierserve_kernels"
SOURCES = (
    "bindings.cpp",
    "gemm.cpp",
    "qgemm.cpp",
    "qgemm_i8.cpp",
    "attention.cpp",
    "layer.cpp",
    "sample.cpp",
    "vec.h",
    "kv.h",
    "qweight.h",
    "parallel.h",
    "pool.cpp",
)
# -ffp-contract=off: no multiply-add is fused unless the source says so (vec.h's `vfma`), so the
# kernels that promise the same bits for any batch, tiling or path round as written.
CFLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fopenmp")
LDFLAGS = ("-fopenmp",)
CSRC = Path(__file__).parent / "csrc"


def _cpu_signature() -> str:
    """The CPU's model and feature flags: -march=native code is only valid where they match."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def build_key() -> str:
    h = hashlib.sha256()
    for name in SOURCES:
        h.update(name.encode() + b"\0" + (CSRC / name).read_bytes())
    h.update(repr((CFLAGS, LDFLAGS, torch.__version__, _cpu_signature())).encode())
    return h.hexdigest()[:16]


def build_dir() -> Path:
    root = os.environ.get("TIERSERVE_KERNELS_DIR")
    if root:
        base = Path(root)
    elif os.access(sys.prefix, os.W_OK):
        base = Path(sys.prefix) / "tierserve-kernels"
    else:
        base = Path.home() / ".cache" / "tierserve" / "kernels"
    return base / build_key()


def load_prebuilt() -> ModuleType | None:
    """The library built for these sources and this CPU, or None if it was not built yet."""
    path = build_dir() / f"{NAME}.so"
    if not path.exists():
        return None
    loader = importlib.machinery.ExtensionFileLoader(NAME, str(path))
    spec = importlib.util.spec_from_file_location(NAME, path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def build(verbose: bool = False) -> ModuleType:
    """Compile (if needed) and import the kernels. Raises if no compiler or ninja is found."""
    from torch.utils import cpp_extension

    # ninja comes from the `ninja` package, whose launcher sits beside this interpreter.
    bindir = str(Path(sys.executable).parent)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    out = build_dir()
    out.mkdir(parents=True, exist_ok=True)
    module = cpp_extension.load(
        NAME,
        [str(CSRC / s) for s in SOURCES if s.endswith(".cpp")],
        extra_cflags=list(CFLAGS),
        extra_ldflags=list(LDFLAGS),
        build_directory=str(out),
        verbose=verbose,
    )
    for old in out.parent.iterdir():  # builds of older sources or another CPU
        if old != out and old.is_dir() and (old / f"{NAME}.so").exists():
            shutil.rmtree(old, ignore_errors=True)
    return module


def main() -> int:
    t0 = time.perf_counter()
    module = build(verbose="-v" in sys.argv[1:])
    print(
        f"tierserve kernels built in {time.perf_counter() - t0:.0f} s: {build_dir()} "
        f"({module.vector_lanes()} float lanes per vector)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
