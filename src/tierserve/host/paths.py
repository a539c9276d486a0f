"""Where tierserve keeps files between runs (torch-free, so the simulator can use it too)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$TIERSERVE_CACHE_DIR``, default ``~/.cache/tierserve``."""
    return Path(os.environ.get("TIERSERVE_CACHE_DIR", Path.home() / ".cache" / "tierserve"))
