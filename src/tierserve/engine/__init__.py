"""The engine: EngineCore (synchronous step loop) and the async front that serves streams."""

from tierserve.engine.core import EngineCore, StepStats

__all__ = ["EngineCore", "StepStats"]
