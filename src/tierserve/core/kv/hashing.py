"""Chained block hashes for prefix caching.

hash(block i) = H(hash(block i-1), token ids of block i, extra keys). The first block's extra key
carries the request's cache salt (per tenant by default), so two tenants' identical prompts hash
differently and never share blocks: no timing side channel through the prefix cache.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

_ROOT = b"\x00" * 16


def hash_block(parent: bytes | None, token_ids: Sequence[int], extra: bytes | None = None) -> bytes:
    h = hashlib.blake2b(parent or _ROOT, digest_size=16)
    h.update(array("q", token_ids).tobytes())
    if extra:
        h.update(b"\xff")
        h.update(extra)
    return h.digest()


def extend_block_hashes(
    hashes: list[bytes], token_ids: Sequence[int], block_size: int, salt: str | None
) -> list[bytes]:
    """Append hashes for every full block of `token_ids` not hashed yet; return `hashes`."""
    num_full = len(token_ids) // block_size
    for i in range(len(hashes), num_full):
        parent = hashes[i - 1] if i > 0 else None
        extra = salt.encode() if (i == 0 and salt) else None
        hashes.append(hash_block(parent, token_ids[i * block_size : (i + 1) * block_size], extra))
    return hashes
