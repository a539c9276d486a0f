"""PNG plots (matplotlib, Agg): the TTFT CDF per class for each run, and P95 TTFT per class
against the load (concurrency or request rate), for one run or several side by side."""

from __future__ import annotations

from pathlib import Path

from tierserve.loadgen.metrics import CLASSES


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _no_data(ax) -> None:
    """Say so in a panel with nothing to draw, rather than leave it blank."""
    ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="0.4")


def load_of(run: dict) -> float | None:
    return run["request_rate"] if run.get("request_rate") is not None else run.get("concurrency")


def load_axis(runs: list[dict]) -> str:
    return "requests per second" if any(r.get("request_rate") for r in runs) else "clients"


def ttft_cdf(titles: list[str], ttfts: list[dict[str, list[float]]], path: Path) -> Path:
    """`ttfts[i][class]`: the measured TTFTs of run i."""
    plt = _plt()
    n = max(1, len(titles))
    fig, axes = plt.subplots(1, n, figsize=(4.5 * n, 3.8), squeeze=False, sharey=True)
    for ax, title, by_class in zip(axes[0], titles, ttfts, strict=False):
        for k, cls in enumerate(CLASSES):
            v = sorted(by_class.get(cls, []))
            if v:
                ys = [(i + 1) / len(v) for i in range(len(v))]
                ax.step(v, ys, where="post", label=cls, color=f"C{k}")
        if not any(by_class.get(cls) for cls in CLASSES):
            _no_data(ax)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("TTFT (s)")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="lower right")
    axes[0][0].set_ylabel("fraction of requests")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def ttft_p95_vs_load(series: dict[str, list[dict]], path: Path) -> Path | None:
    """One panel per class, one line per series (a run's label -> its load levels)."""
    pts = {k: [r for r in runs if not r.get("phase") and load_of(r)] for k, runs in series.items()}
    if not any(pts.values()):
        return None
    plt = _plt()
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.8), sharex=True, sharey=True)
    xlabel = load_axis([r for runs in pts.values() for r in runs])
    for ax, cls in zip(axes, CLASSES, strict=True):
        if all(r["classes"][cls]["ttft_p95_s"] is None for runs in pts.values() for r in runs):
            _no_data(ax)
        for name, runs in pts.items():
            runs = sorted(runs, key=load_of)
            ys = [r["classes"][cls]["ttft_p95_s"] for r in runs]
            ax.plot(
                [load_of(r) for r in runs],
                [float("nan") if y is None else y for y in ys],
                marker="o",
                linestyle="--" if name.startswith("sim ") else "-",  # predictions dashed
                label=name,
            )
        ax.set_title(f"{cls} TTFT P95")
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
        ax.set_xscale("log", base=2)
    axes[0].set_ylabel("seconds")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
