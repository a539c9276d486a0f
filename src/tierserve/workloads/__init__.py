"""Workloads shared by the simulator and the load generator: classes, lengths, arrivals.
synthetic.py: the seeded class mix (lengths drawn per class); heavy_tail.py: per-template
lengths ending by EOS, built on it."""

from tierserve.workloads.heavy_tail import HeavyTailWorkload
from tierserve.workloads.synthetic import Workload, WorkloadConfig


def make_workload(cfg: WorkloadConfig) -> Workload:
    """The workload `cfg` describes (its ``lengths`` choose the kind)."""
    if cfg.lengths == "heavy_tail":
        return HeavyTailWorkload(cfg)
    return Workload(cfg)


__all__ = ["make_workload"]
