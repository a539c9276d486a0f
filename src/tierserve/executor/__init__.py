"""Executors turn a SchedulerOutput into sampled tokens: a deterministic fake for tests, the
PyTorch model executor, and the cost-model executor of the simulator."""

from tierserve.executor.base import Executor

__all__ = ["Executor"]
