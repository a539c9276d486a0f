"""The predictor's state on disk: one JSON file under the cache dir, written atomically.

``$TIERSERVE_CACHE_DIR/predictor/lengths.json`` by default (the cache dir as the autotune cache
and the simulator's profiles find it, tierserve/host/paths.py); ``$TIERSERVE_PREDICTOR_STATE`` names
another file (a benchmark gives each server its own, so no run starts from another's learning).
A missing file is a cold start; a corrupt or foreign one (bad UTF-8, bad JSON, another
version) is ignored with one warning (logged, and returned) and moved aside to
``<name>.corrupt`` for a person to inspect, so the next save does not write over it; never a
crash.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

from tierserve.core.predict.predictor import LengthPredictor
from tierserve.host.paths import cache_dir

log = logging.getLogger(__name__)


STATE_ENV = "TIERSERVE_PREDICTOR_STATE"


def default_path() -> Path:
    named = os.environ.get(STATE_ENV)
    return Path(named) if named else cache_dir() / "predictor" / "lengths.json"


def load_state(predictor: LengthPredictor, path: Path | None = None) -> str | None:
    """Restore `predictor` from `path`. Returns None when restored or when there is no file;
    else the warning (the file is left alone and the predictor starts cold)."""
    path = path or default_path()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        msg = f"predictor state {path} unreadable ({e.strerror}); starting cold"
        log.warning(msg)
        return msg
    try:  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
        predictor.restore(json.loads(data.decode("utf-8")))
    except (ValueError, TypeError, AttributeError, KeyError, IndexError, RecursionError) as e:
        aside = path.with_name(path.name + ".corrupt")
        try:
            path.replace(aside)
            kept = f"moved to {aside}"
        except OSError:
            kept = "left in place"
        reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        msg = f"predictor state {path} is corrupt ({reason}); ignored ({kept}), starting cold"
        log.warning(msg)
        return msg
    return None


def save_state(predictor: LengthPredictor, path: Path | None = None) -> Path:
    """Write `predictor`'s state to `path` (temporary file + rename: a crash mid-write leaves
    the old file). Returns the path."""
    path = path or default_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".lengths-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(predictor.to_json(), f, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
