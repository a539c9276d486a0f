"""Predictive scheduling on the real engine (issue 26): `tierserve serve --predictive X` for each
X, driven by `tierserve bench serve --workload heavy-tail` (the simulator's heavy-tailed mix:
tenants, templates, lognormal / mixture output lengths, each request ending by EOS at its drawn
length) at each concurrency, printing per run: preemptions, total and output tok/s, P1 P95
end-to-end, P1 / P2 mean TTFT, P0 P95 TTFT, worst TTFT, and the predictor's error |actual -
P50| at P50 / P90 per class (from `llm_output_length_prediction_error_tokens` on /metrics,
the difference across the run, interpolated in its buckets 1, 2, 5, 10, 20, 50, ...).

It starts each server itself (this interpreter: `PYTHONPATH=src` picks the checkout; the
embedded model; a tenants file giving tenant-0..3 their keys; its own predictor state file,
cold unless `--predictor-state FILE` is copied in), drives `--learn` seconds of the mix first
(another seed, not measured) so every variant's predictor has learned the same way, then runs
the levels against it in order; or it targets one running server with `--url` (start it with
`--tenants` from `--write-tenants`).

    export PYTHONPATH=src; B=benchmarks/served/predictive_serve.py
    .venv/bin/python $B                       # 5 servers x (60 s + 32, 64 clients x 120 s): ~30 min
    .venv/bin/python $B --kv-blocks 400       # memory pressure (6,400 tokens of KV)
    .venv/bin/python $B --predictive off all --duration 30 --learn 30   # a short proof
    .venv/bin/python $B --url http://127.0.0.1:8000 --label mine   # a running server

Lengths: the CPU preset (the simulator's lengths x0.1: prompts ~60-250 tokens, outputs from
~1 (classify) to ~150 (agent's tail, report) tokens, `max_tokens` 410). Run on a quiet machine:
every figure here is a latency or a rate.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

from tierserve.loadgen.server import served

VARIANTS = ("off", "order", "reserve", "ttft", "all")
TENANTS = ("tenant-0", "tenant-1", "tenant-2", "tenant-3")
ERROR_METRIC = "llm_output_length_prediction_error_tokens"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


def key_of(tenant: str) -> str:
    return f"bench-{tenant}"


def tenants_yaml() -> str:
    rows = [f"  {t}:\n    keys: [{key_of(t)}]\n    max_tier: realtime\n" for t in TENANTS]
    return "tenants:\n" + "".join(rows)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(variant: str, args, tmp: Path):
    """A `tierserve serve --predictive <variant>` on a free port; yields its URL."""
    state = tmp / f"predictor-{variant}.json"
    if args.predictor_state:
        shutil.copy(args.predictor_state, state)
    cmd = ["--log-level", "warning", "--tenants", str(tmp / "tenants.yaml"),
           "--predictive", *variant.split()]  # fmt: skip
    if args.kv_blocks:
        cmd += ["--num-kv-blocks", str(args.kv_blocks)]
    cmd += args.serve_args.split()
    print("server: serve", " ".join(cmd), flush=True)
    env = {"TIERSERVE_PREDICTOR_STATE": str(state)}
    log = tmp / f"server-{variant}.log"
    with served(cmd, log=log, env=env, timeout_s=300) as url:
        yield url


def scrape(url: str) -> dict[tuple[str, str], float]:
    """Every sample on /metrics: (name, labels) -> value."""
    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


def _label(labels: str, name: str) -> str | None:
    m = re.search(rf'{name}="([^"]*)"', labels)
    return m.group(1) if m else None


def counter_diff(before: dict, after: dict, name: str) -> float:
    return sum(v - before.get(k, 0.0) for k, v in after.items() if k[0] == name)


def hist_quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Prometheus' histogram_quantile on cumulative (upper bound, count) pairs."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank, lo, below = q * buckets[-1][1], 0.0, 0.0
    for le, n in buckets:
        if n >= rank:
            if le == float("inf"):
                return lo
            return lo + (le - lo) * (rank - below) / (n - below) if n > below else le
        lo, below = le, n
    return lo


def error_by_class(before: dict, after: dict) -> dict[str, dict]:
    """Predictor error |actual - P50| per class over the run: count, P50, P90."""
    by: dict[str, dict[float, float]] = {}
    for (name, labels), v in after.items():
        if name != f"{ERROR_METRIC}_bucket":
            continue
        cls, le = _label(labels, "priority"), _label(labels, "le")
        bound = float("inf") if le == "+Inf" else float(le)
        by.setdefault(cls, {})[bound] = v - before.get((name, labels), 0.0)
    out = {}
    for cls, b in sorted(by.items()):
        cum = sorted(b.items())
        out[cls] = {
            "n": int(cum[-1][1]),
            "p50": hist_quantile(cum, 0.5),
            "p90": hist_quantile(cum, 0.9),
        }
    return out


def bench(url: str, clients: int, args, out: Path, learn: bool = False) -> dict:
    """One level (or, `learn`, the unmeasured pass that teaches the predictor first: its own
    seed, `--learn` seconds, in-flight requests cut after 5 s)."""
    duration, seed = (args.learn, args.seed + 1000) if learn else (args.duration, args.seed)
    cmd = [sys.executable, "-m", "tierserve", "bench", "serve", "--base-url", url,
           "--workload", "heavy-tail", "--lengths", "cpu",
           "--length-scale", str(args.length_scale), "--concurrency", str(clients),
           "--duration", str(duration), "--seed", str(seed),
           "--out", str(out), "--no-progress"]  # fmt: skip
    if learn:
        cmd += ["--warmup", "0", "--drain-timeout", "5"]
    elif args.warmup is not None:
        cmd += ["--warmup", str(args.warmup)]
    for t in TENANTS:
        cmd += ["--tenant-key", f"{t}={key_of(t)}"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "results.json").read_text())["runs"][0]


def _pct(xs: list[float], q: float) -> float | None:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))] if xs else None


def latency(out: Path) -> dict:
    """From the measured, completed requests: TTFT and end-to-end figures by class."""
    ttft: dict[int, list[float]] = {c: [] for c in range(4)}
    e2e: dict[int, list[float]] = {c: [] for c in range(4)}
    for line in (out / "requests.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["measured"] and r["outcome"] == "completed" and r["chunk_times"]:
            ttft[r["priority"]].append(r["chunk_times"][0] - r["arrival"])
            e2e[r["priority"]].append(r["finish"] - r["arrival"])

    def mean(xs):
        return sum(xs) / len(xs) if xs else None

    every = [x for xs in ttft.values() for x in xs]
    return {
        "p1_e2e_p95": _pct(e2e[1], 95),
        "p1_ttft_mean": mean(ttft[1]),
        "p2_ttft_mean": mean(ttft[2]),
        "p0_ttft_p95": _pct(ttft[0], 95),
        "worst_ttft": max(every) if every else None,
        "completed": sum(len(x) for x in ttft.values()),
    }


def one_level(url: str, variant: str, clients: int, args, tmp: Path) -> dict:
    before = scrape(url)
    out = tmp / f"{variant.replace(' ', '+')}-{clients}"
    run = bench(url, clients, args, out)
    after = scrape(url)
    return {
        "variant": variant,
        "clients": clients,
        "preemptions": int(counter_diff(before, after, "llm_preemption_total")),
        "total_tok_s": run["throughput_total_tokens_per_s"],
        "out_tok_s": run["throughput_tokens_per_s"],
        **latency(out),
        "failed": run["failed"],
        "rejected": run["rejected"],
        "error": error_by_class(before, after),
    }


def _f(x, nd=2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def row(m: dict) -> str:
    err = "; ".join(
        f"{c} {_f(e['p50'], 0)}/{_f(e['p90'], 0)} (n {e['n']})"
        for c, e in m["error"].items()
        if e["n"]
    )
    return (
        f"| {m['variant']} | {m['clients']} | {m['preemptions']} | {_f(m['total_tok_s'], 1)} "
        f"| {_f(m['out_tok_s'], 1)} | {_f(m['p1_e2e_p95'])} | {_f(m['p1_ttft_mean'])} "
        f"| {_f(m['p2_ttft_mean'])} | {_f(m['p0_ttft_p95'])} | {_f(m['worst_ttft'])} "
        f"| {m['completed']} | {err or '-'} |"
    )


HEAD = (
    "| predictive | clients | preemptions | total tok/s | out tok/s | P1 P95 e2e s "
    "| P1 mean TTFT s | P2 mean TTFT s | P0 P95 TTFT s | worst TTFT s | completed "
    "| predictor error P50/P90 tokens |\n" + "|---" * 12 + "|"
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--predictive", nargs="+", default=list(VARIANTS),
                   help="variants, each a --predictive value ('order ttft': both)")  # fmt: skip
    p.add_argument("--concurrency", type=int, nargs="+", default=[32, 64])
    p.add_argument("--duration", type=float, default=120.0, help="s of sending per level")
    p.add_argument("--warmup", type=float, default=None, help="s not measured (default 1/6)")
    p.add_argument("--length-scale", type=float, default=1.0, help="on the cpu preset")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-blocks", type=int, default=None, help="the server's --num-kv-blocks")
    p.add_argument("--serve-args", default="", help="more `tierserve serve` flags")
    p.add_argument("--predictor-state", default=None, help="each server starts from this file")
    p.add_argument("--learn", type=float, default=60.0,
                   help="s of unmeasured load first: the predictor learns (0: cold)")  # fmt: skip
    p.add_argument("--url", default=None, help="a running server (tenants from --write-tenants)")
    p.add_argument("--label", default="running", help="--url: the variant's name")
    p.add_argument("--write-tenants", default=None, help="write the tenants file here and exit")
    p.add_argument("--out", default=None, help="keep the runs here (default: a temp dir)")
    p.add_argument("--json", default=None, help="write every row here")
    args = p.parse_args()
    if args.write_tenants:
        Path(args.write_tenants).write_text(tenants_yaml())
        return
    tmp = Path(args.out or tempfile.mkdtemp(prefix="predictive-serve-"))
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "tenants.yaml").write_text(tenants_yaml())
    rows = []
    print(HEAD, flush=True)
    for variant in [args.label] if args.url else args.predictive:
        with contextlib.ExitStack() as stack:
            url = args.url or stack.enter_context(server(variant, args, tmp))
            if args.learn > 0:
                bench(url, args.concurrency[0], args, tmp / f"{variant}-learn", learn=True)
            for clients in args.concurrency:
                m = one_level(url, variant, clients, args, tmp)
                rows.append(m)
                print(row(m), flush=True)
    print(f"runs kept in {tmp}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
