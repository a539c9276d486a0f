"""Micro-benchmark of the KV cache manager: allocate + free cost per block and per request.

``tierserve bench-kv`` prints a table; compare runs on the same machine only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tierserve.config import CacheConfig
from tierserve.core.kv import KVCacheManager
from tierserve.priority import Priority
from tierserve.request import Request


@dataclass
class KVBenchRow:
    case: str
    requests: int
    blocks: int
    seconds: float

    @property
    def us_per_request(self) -> float:
        return 1e6 * self.seconds / max(1, self.requests)

    @property
    def ns_per_block(self) -> float:
        return 1e9 * self.seconds / max(1, self.blocks)


def _requests(n: int, tokens_each: int, block_size: int, distinct: bool) -> list[Request]:
    out = []
    for i in range(n):
        base = i * tokens_each if distinct else 0
        out.append(
            Request(
                f"b{i}",
                list(range(base, base + tokens_each)),
                priority=Priority(i % 4),
                cache_salt=None,
            )
        )
    return out


def _alloc_free(kv: KVCacheManager, reqs: list[Request], tokens_each: int) -> int:
    blocks = 0
    for r in reqs:
        hit = kv.get_computed_blocks(r)
        ids = kv.allocate_slots(r, tokens_each - hit.num_tokens, hit)
        if ids is None:
            raise RuntimeError("benchmark pool too small")
        blocks += len(ids)
        r.num_computed_tokens = tokens_each
        kv.cache_blocks(r)
    for r in reqs:
        kv.free(r.request_id)
        r.num_computed_tokens = 0
    return blocks


def run_kv_bench(num_blocks: int = 100_000, block_size: int = 16) -> list[KVBenchRow]:
    cfg = CacheConfig(block_size=block_size, num_blocks=num_blocks)
    rows = []
    # P0 is capped by its ceiling (60%); size the batches to fit every class.
    for case, per_req_blocks, distinct in (
        ("1-block requests", 1, True),
        ("64-block requests", 64, True),
        ("64-block, shared prefix", 64, False),
    ):
        kv = KVCacheManager(cfg)
        tokens_each = per_req_blocks * block_size
        n = int(num_blocks * 0.5) // per_req_blocks
        reqs = _requests(n, tokens_each, block_size, distinct)
        _alloc_free(kv, reqs, tokens_each)  # warm: hashes computed, prefix cache filled
        t0 = time.perf_counter()
        blocks = _alloc_free(kv, reqs, tokens_each)
        rows.append(KVBenchRow(case, n, max(blocks, n), time.perf_counter() - t0))
        kv.check_invariants()
    # Decode: one slot at a time, a block every block_size steps.
    kv = KVCacheManager(cfg)
    reqs = _requests(1000, block_size, block_size, True)
    for r in reqs:
        kv.allocate_slots(r, block_size)
        r.num_computed_tokens = block_size
    steps = 4 * block_size
    t0 = time.perf_counter()
    for _ in range(steps):
        for r in reqs:
            r.append_output(1)
            kv.allocate_slots(r, 1)
            r.num_computed_tokens += 1
    dt = time.perf_counter() - t0
    rows.append(KVBenchRow("decode append (per token)", len(reqs) * steps, len(reqs) * 4, dt))
    return rows


def format_rows(rows: list[KVBenchRow], num_blocks: int) -> str:
    lines = [
        f"KV cache manager, pool of {num_blocks} blocks",
        f"{'case':<28}{'requests':>10}{'blocks':>10}{'us/request':>12}{'ns/block':>10}",
    ]
    for r in rows:
        lines.append(
            f"{r.case:<28}{r.requests:>10}{r.blocks:>10}{r.us_per_request:>12.2f}"
            f"{r.ns_per_block:>10.0f}"
        )
    return "\n".join(lines)
