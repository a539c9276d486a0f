"""tierserve's C++ CPU kernels: small-batch GEMM, paged attention read straight from the KV cache,
and seeded Gumbel-max sampling (sources in ``csrc/``, compiled for this machine by
``python -m tierserve.kernels.build``, which ``make setup`` runs).

``get()`` returns the compiled module, or None where the pure-PyTorch path must be used.
The environment variable ``TIERSERVE_KERNELS`` selects:

* ``auto`` (default): use the kernels; build them on first use if ``make setup`` did not, and
  fall back to PyTorch with a warning if they cannot be built;
* ``off``: the pure-PyTorch path everywhere (the reference the kernels are tested against);
* ``on``: the kernels or an error.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType

log = logging.getLogger(__name__)

_MODES = ("auto", "on", "off")
_cache: dict[str, ModuleType | None] = {}


def mode() -> str:
    m = os.environ.get("TIERSERVE_KERNELS", "auto").strip().lower() or "auto"
    if m not in _MODES:
        raise ValueError(f"TIERSERVE_KERNELS must be one of {', '.join(_MODES)}, got {m!r}")
    return m


def get() -> ModuleType | None:
    """The compiled kernels, or None (mode ``off``, or ``auto`` where building failed)."""
    m = mode()
    if m == "off":
        return None
    if "module" not in _cache:
        _cache["module"] = _load(required=m == "on")
    return _cache["module"]


def _load(required: bool) -> ModuleType | None:
    from tierserve.kernels import build

    try:
        module = build.load_prebuilt()
        if module is None:
            log.warning("compiling tierserve's CPU kernels for this machine (once, ~1 min)")
            module = build.build()
        return module
    except Exception as e:  # no compiler, no ninja, a failed compile: the PyTorch path serves
        if required:
            raise RuntimeError(f"TIERSERVE_KERNELS=on but the kernels cannot load: {e}") from e
        log.warning("tierserve's CPU kernels are unavailable, using PyTorch ops: %s", e)
        return None
