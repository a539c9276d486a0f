"""A live progress bar (tqdm, on stderr; silent when stderr is not a terminal or when off)."""

from __future__ import annotations

from collections import Counter


class Progress:
    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._bar = None

    def start(self, label: str, total: float, unit: str) -> None:
        self.close()
        if not self.enabled:
            return
        from tqdm import tqdm

        fmt = (
            "{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} {unit} "
            "[{elapsed}<{remaining}{postfix}]"
        )
        self._bar = tqdm(
            total=total, desc=label, unit=unit, disable=None, leave=True, bar_format=fmt
        )

    def update(self, done: float, records) -> None:
        if self._bar is None:
            return
        c = Counter(r.outcome for r in records)
        self._bar.n = min(done, self._bar.total)
        counts = {"ok": c["completed"], "refused": c["rejected"], "failed": c["failed"]}
        self._bar.set_postfix(ordered_dict={**counts, "busy": c["unfinished"]})

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
