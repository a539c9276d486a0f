"""tierserve: an LLM inference server built around multi-level priority scheduling."""

from tierserve.priority import Priority, parse_priority
from tierserve.sampling_params import SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "Priority", "SamplingParams", "__version__", "parse_priority"]


def __getattr__(name: str):
    # The offline API pulls in torch; import it only when asked for.
    if name == "LLM":
        from tierserve.llm import LLM

        return LLM
    raise AttributeError(name)
