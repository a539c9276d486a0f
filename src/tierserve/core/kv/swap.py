"""CPU swap space: a second, host-side pool of KV blocks. Plain free list of block ids; swapped
blocks hold one request's private copy, so there is no sharing or caching here."""

from __future__ import annotations

from tierserve.core.kv.errors import KVCacheError


class SwapSpace:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 0:
            raise KVCacheError(f"swap space size must not be negative, got {num_blocks}")
        self.num_blocks = num_blocks
        # Popped from the end: lowest ids are handed out first.
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def allocate(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        return [self._free.pop() for _ in range(n)]

    def free(self, block_ids: list[int]) -> None:
        self._free.extend(reversed(block_ids))

    def check_invariants(self, held: list[list[int]]) -> None:
        seen: set[int] = set(self._free)
        if len(seen) != len(self._free):
            raise AssertionError("a swap block appears twice in the free list")
        for ids in held:
            for i in ids:
                if i in seen:
                    raise AssertionError(f"swap block {i} is both free and held (or held twice)")
                seen.add(i)
        if seen != set(range(self.num_blocks)):
            raise AssertionError("swap blocks lost: free + held != all")
