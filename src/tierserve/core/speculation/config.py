"""`--speculative-config`: vLLM's JSON keys where they apply, checked with errors that name the
key."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

# vLLM's names: "ngram" (prompt lookup), "draft_model" (a separate, smaller model; vLLM also
# infers it from "model" given without "method").
METHODS = ("ngram", "draft_model")
_KEYS = {
    "method",
    "model",
    "num_speculative_tokens",
    "prompt_lookup_max",
    "prompt_lookup_min",
    "classes",
    "latency_classes",
    "throughput_floor",
}


@dataclass(frozen=True)
class SpecConfig:
    method: str = "ngram"
    model: str | None = None  # draft_model: the draft model's path (GGUF file or HF folder)
    num_speculative_tokens: int = 4  # the most drafts per request per step
    prompt_lookup_max: int = 4  # longest suffix n-gram looked up
    prompt_lookup_min: int = 2  # shortest
    # Classes that may speculate whenever it pays; the others only when running alone.
    classes: tuple[int, ...] = (0, 1)
    prior_acceptance: float = 0.5  # before any draft of a class was verified
    # Classes whose drafts are sized for their own latency, within `throughput_floor` x the
    # step's rate without drafts (core/speculation/rule.py); the others for the step's throughput.
    latency_classes: tuple[int, ...] = (0,)
    throughput_floor: float = 0.97

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise ValueError(f"speculative config: {msg}")

        if self.method not in METHODS:
            bad(f"method must be one of {METHODS}, got {self.method!r}")
        if self.method == "draft_model" and not self.model:
            bad("method 'draft_model' needs 'model': the draft model's path (.gguf or folder)")
        if self.method != "draft_model" and self.model is not None:
            bad(f"'model' is for method 'draft_model', not {self.method!r}")
        for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                bad(f"{name} must be a positive integer, got {v!r}")
        if self.num_speculative_tokens > 16:
            bad(f"num_speculative_tokens must be at most 16, got {self.num_speculative_tokens}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            bad(
                f"prompt_lookup_min ({self.prompt_lookup_min}) must not exceed "
                f"prompt_lookup_max ({self.prompt_lookup_max})"
            )
        for name in ("classes", "latency_classes"):
            v = getattr(self, name)
            if not all(isinstance(c, int) and 0 <= c <= 3 for c in v):
                bad(f"{name} must be priorities 0-3, got {v!r}")
        if not 0.5 <= self.throughput_floor <= 1.0:
            bad(f"throughput_floor must lie in [0.5, 1], got {self.throughput_floor}")
        if not 0.0 < self.prior_acceptance < 1.0:
            bad(f"prior_acceptance must lie in (0, 1), got {self.prior_acceptance}")


def parse_speculative_config(raw: str | dict | None) -> SpecConfig | None:
    """A JSON object (or dict) -> SpecConfig; None, "" or "off" -> no speculation."""
    if raw is None or (isinstance(raw, str) and raw.strip().lower() in ("", "off", "none")):
        return None
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"speculative config is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"speculative config must be a JSON object, got {raw!r}")
    unknown = set(raw) - _KEYS
    if unknown:
        raise ValueError(
            f"speculative config: unknown key(s) {sorted(unknown)}; known: {sorted(_KEYS)}"
        )
    kw = dict(raw)
    if kw.get("model") is not None and "method" not in kw:
        kw["method"] = "draft_model"  # as vLLM infers it
    for key in ("classes", "latency_classes"):
        if key in kw:
            kw[key] = tuple(kw[key])
    return SpecConfig(**kw)


def with_draft_model(config: SpecConfig | None, path: str | None) -> SpecConfig | None:
    """`--speculative-model PATH` over `--speculative-config`: the config (or the defaults)
    with the draft model as drafter. A config naming another model is an error."""
    if not path:
        return config
    if config is None:
        return SpecConfig(method="draft_model", model=path)
    if config.model not in (None, path):
        raise ValueError(
            f"--speculative-model {path!r} and --speculative-config's model {config.model!r} "
            "differ: give the draft model once"
        )
    return replace(config, method="draft_model", model=path)
