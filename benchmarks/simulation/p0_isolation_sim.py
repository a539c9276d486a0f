"""Issue 21's figures in the simulator, on the CPU engine's step times (`cpu-local` profile,
SmolLM2-135M; sim/promise.py), before and after each fix, with its target:

    PYTHONPATH=src .venv/bin/python benchmarks/simulation/p0_isolation_sim.py       # ~1 min on 2
    cores

* item 1: the P0 prefix hit rate under a background flood that churns the cache, LRU
  (`prefix_retention` 0 0 0 0, the old rule) against retention by class;
* item 2: P0 TTFT behind one long request (a 7,000-token P3 prompt, a 2,000-token prompt, a
  2,000-token echo + logprobs scoring request with max_tokens 0), steps sized by tokens (the
  old rule, `step_time_fraction` None) against by predicted time; `bench serve`'s throughput
  shape at 1, 8 and 32 clients, both ways;
* item 3: the open-loop overload under SLA admission (20 P1 + 1 P0 a second for 30 s, then a
  lone P1 5 s after), three seeds. Its "before" needs the old code: run this file with
  `PYTHONPATH=<old checkout>/src` (the old simulator also needs its driver fixed, see
  docs/scheduling.md).

Deterministic: the same numbers on any machine.
"""

from __future__ import annotations

import argparse

from tierserve.config import LRU_RETENTION, CacheConfig
from tierserve.sim.promise import (
    DEFAULT_FRACTION,
    LONE,
    bench_throughput,
    on_time,
    overload,
    prefix_churn,
    probe_behind,
)

P0, P1 = 0, 1
LONG = [("P3, 7,000-token prompt", "background", 7000),
        ("2,000-token prompt", "plain", 2000),
        ("2,000-token scoring request", "scoring", 2000)]  # fmt: skip


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]


def item1() -> None:
    print("## item 1: P0 prefix hit rate, probe every 40 s, flood refilling the cache in ~25 s")
    for name, retention in (("LRU", LRU_RETENTION), ("by class", CacheConfig().prefix_retention)):
        hit, done = prefix_churn(retention)
        print(f"{name:>9}: P0 prefix hit rate {hit:.1%}, background requests done {done}")


def item2() -> None:
    print("## item 2: P0 TTFT behind one long request (target P95 <= 0.5 s)")
    for name, kind, n in LONG:
        for rule, fraction in (("tokens", None), ("time", DEFAULT_FRACTION)):
            ttft, steps = [], []
            for seed in range(5):  # five runs, probes at other random times
                t, s = probe_behind(kind, n, fraction, seed)
                ttft += t
                steps += s
            print(f"{name}, sized by {rule}: P50 {pct(ttft, 50):.3f} s"
                  f" P95 {pct(ttft, 95):.3f} s max {max(ttft):.3f} s ({len(ttft)} probes),"
                  f" longest step {max(steps):.3f} s")  # fmt: skip
    print("## item 2: bench serve's throughput shape, output tokens/s (target: within 5%)")
    for clients in (1, 8, 32):
        old, new = bench_throughput(clients, None), bench_throughput(clients)
        print(f"{clients:>3} clients: by tokens {old:.1f}, by time {new:.1f} ({new / old:.1%})")


def item3() -> None:
    print("## item 3: open-loop overload, SLA admission (targets: P1 >= 95%, P0 >= 99% on time)")
    for seed in (0, 1, 2):
        r = overload(seed)
        burst = [x for x in r["records"] if x.request_id != LONE]
        p1, a1, s1 = on_time(burst, P1, 5.0)
        p0, a0, s0 = on_time(burst, P0, 0.5)
        err = [abs(x.first_token - x.arrival - x.predicted_ttft) for x in burst
               if x.priority == P1 and x.first_token is not None and x.predicted_ttft]  # fmt: skip
        lone = [x for x in r["records"] if x.request_id == LONE]
        got = lone[0].outcome if lone else "not sent"
        print(f"seed {seed}: P1 {a1}/{s1} admitted, {p1:.1%} on time; P0 {a0}/{s0}, {p0:.1%};"
              f" P1 |error| P50 {pct(err, 50):.2f} s P90 {pct(err, 90):.2f} s;"
              f" lone P1 5 s after: {got}")  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("items", nargs="*", type=int, default=[1, 2, 3])
    for item in p.parse_args().items:
        {1: item1, 2: item2, 3: item3}[item]()


if __name__ == "__main__":
    main()
