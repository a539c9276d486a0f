"""Process memory settings for a long-running server: the heap frozen after start-up, and
glibc's mmap threshold.

glibc raises its mmap threshold dynamically once a large block is freed, after which blocks up
to 32 MiB come from the heap, which rarely shrinks. The engine allocates and frees buffers of
varying sizes in the tens of MiB every step (gathered KV contexts, prefill activations), so the
heap ratchets up. Fixing the threshold at 4 MiB keeps such buffers in mmap'ed memory that is
returned to the system on free, and makes every such buffer fresh memory whose pages fault in
again: ~100 MiB less peak RSS for ~25% of prefill speed here, so the server applies it only when
$TIERSERVE_MMAP_THRESHOLD_MIB is set. Measured with benchmarks/served/serve_peak_memory.py
(docs/performance.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys

M_MMAP_THRESHOLD = -3


def fix_mmap_threshold(nbytes: int = 4 << 20) -> bool:
    """Return True when the setting was applied (glibc on Linux), False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        return bool(libc.mallopt(M_MMAP_THRESHOLD, ctypes.c_int(nbytes)))
    except (OSError, AttributeError):
        return False


def freeze_heap() -> None:
    """Collect once, then move every object alive after start-up (model, tokenizer, modules:
    ~240k objects) out of the collector's sight. Without this a full collection walks them all
    while holding the GIL: 115-135 ms on the AMD EPYC of docs/performance.md, a stall in every
    stream and in /health whenever allocation triggers one (vLLM freezes its heap too)."""
    gc.collect()
    gc.freeze()
