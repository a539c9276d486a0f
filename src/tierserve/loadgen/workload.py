"""What to send: the simulator's workload (`sim/workload.py`: class mix, per-class prompt and
output length distributions, seeded draws, Poisson / gamma gaps) turned into real requests.

Lengths come from a preset (`sim`: the simulator's defaults; `cpu`: the same shapes about 10x
shorter, as `tierserve sim-fidelity` uses on a 2-core CPU), optionally scaled, or fixed per class.
The same seed gives the same sequence of requests (class, lengths, text) whatever the load
shape, so runs against different servers or policies send the same work.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from pathlib import Path

from tierserve.priority import Priority, parse_priority
from tierserve.workloads.synthetic import (
    CPU_CLASSES,
    DEFAULT_CLASSES,
    ClassSpec,
    LengthDist,
    Workload,
    WorkloadConfig,
)

LENGTH_PRESETS = {"sim": DEFAULT_CLASSES, "cpu": CPU_CLASSES}


@dataclass(frozen=True)
class RequestSpec:
    index: int  # position in the seeded sequence
    priority: Priority
    prompt: str  # the text (chat: the user message; completions: the prompt)
    prompt_tokens: int  # as counted by our tokenizer (the server's usage wins when given)
    max_tokens: int
    messages: tuple[dict, ...] | None = None  # a dataset conversation (chat)
    # --workload heavy-tail (loadgen/heavy_tail.py): who sends it, through which template, and
    # the output length it is to end at (by EOS; the server's predictor never reads it).
    tenant: str | None = None
    template: str | None = None
    stop_after: int | None = None


def _scaled(d: LengthDist, f: float) -> LengthDist:
    return LengthDist(d.median * f, d.sigma, max(1, round(d.lo * f)), max(1, round(d.hi * f)))


def _fixed(n: int) -> LengthDist:
    return LengthDist(float(n), 0.0, n, n)


def _per_class(values: list[int] | None, name: str) -> list[int] | None:
    if values is None:
        return None
    if len(values) not in (1, 4) or any(v < 1 for v in values):
        raise ValueError(f"{name} takes 1 or 4 positive token counts (P0..P3), got {values}")
    return values * 4 if len(values) == 1 else list(values)


def class_specs(
    preset: str = "sim",
    scale: float = 1.0,
    prompt_len: list[int] | None = None,
    output_len: list[int] | None = None,
) -> dict[Priority, ClassSpec]:
    """Per-class length distributions: a preset, scaled, with fixed overrides."""
    if preset not in LENGTH_PRESETS:
        raise ValueError(
            f"unknown length preset {preset!r}: expected one of {list(LENGTH_PRESETS)}"
        )
    if scale <= 0:
        raise ValueError(f"--length-scale must be positive, got {scale}")
    pl, ol = _per_class(prompt_len, "--prompt-len"), _per_class(output_len, "--output-len")
    out = {}
    for p, spec in LENGTH_PRESETS[preset].items():
        prompt, output = _scaled(spec.prompt, scale), _scaled(spec.output, scale)
        out[p] = replace(
            spec,
            prompt=_fixed(pl[p]) if pl else prompt,
            output=_fixed(ol[p]) if ol else output,
        )
    return out


class RandomSource:
    """Requests drawn from the simulator's workload; prompt text from `prompts` (a PromptMaker),
    seeded by `text_seed` (default the workload's seed). A sweep gives each level its own text
    seed: the same work, but no prompt a prefix cache has seen at the previous level."""

    def __init__(self, cfg: WorkloadConfig, prompts, text_seed: str | int | None = None) -> None:
        self.cfg, self.prompts = cfg, prompts
        self.text_seed = cfg.seed if text_seed is None else text_seed
        self._wl = Workload(cfg)
        self._n = 0

    def shape(self) -> tuple[int, Priority, int, int]:
        """(index, class, prompt tokens, output tokens) of the next request."""
        req = self._wl.make(0.0)
        i, self._n = self._n, self._n + 1
        return i, req.priority, len(req.prompt_token_ids), req.sampling_params.max_tokens

    def next(self) -> RequestSpec:
        i, prio, n_prompt, n_out = self.shape()
        text = self.prompts.make(n_prompt, i, self.text_seed)
        return RequestSpec(i, prio, text, n_prompt, n_out)


class Gaps:
    """Open-loop inter-arrival times, from the simulator's Poisson / gamma logic. Seeded apart
    from the requests, so the request sequence does not depend on the arrival process."""

    def __init__(self, arrival: str, rate: float, gamma_cv: float, seed: int) -> None:
        if rate <= 0:
            raise ValueError(f"--request-rate must be positive, got {rate}")
        self._wl = Workload(
            WorkloadConfig(arrival=arrival, rate=rate, gamma_cv=gamma_cv, seed=seed + 1)
        )

    def next(self) -> float:
        return self._wl.gap()


# -- sharegpt-like datasets -----------------------------------------------------------------

_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}
_ROLES |= {"system": "system", "chatgpt": "assistant", "bard": "assistant", "model": "assistant"}


class DatasetError(ValueError):
    """A dataset file that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class Conversation:
    messages: tuple[dict, ...]  # up to and including the last user turn
    reply: str | None  # the assistant turn after it, if any: its length is the output length
    priority: Priority | None


def _turns(obj: dict, where: str) -> list[dict]:
    if isinstance(obj.get("messages"), list):
        raw = [(m.get("role"), m.get("content")) for m in obj["messages"] if isinstance(m, dict)]
    elif isinstance(obj.get("conversations"), list):
        raw = [(m.get("from"), m.get("value")) for m in obj["conversations"] if isinstance(m, dict)]
    else:
        raise DatasetError(f"{where}: expected a 'conversations' or 'messages' list")
    turns = []
    for role, content in raw:
        if _ROLES.get(str(role).lower()) is None or not isinstance(content, str):
            raise DatasetError(f"{where}: a turn needs a known role and a text, got {role!r}")
        turns.append({"role": _ROLES[str(role).lower()], "content": content})
    return turns


def parse_conversation(obj: object, where: str) -> Conversation | None:
    """One JSONL line; None when it has no user turn."""
    if not isinstance(obj, dict):
        raise DatasetError(f"{where}: expected a JSON object")
    turns = _turns(obj, where)
    users = [i for i, t in enumerate(turns) if t["role"] == "user"]
    if not users:
        return None
    last = users[-1]
    after = turns[last + 1] if last + 1 < len(turns) else None
    try:
        prio = None if obj.get("priority") is None else parse_priority(obj["priority"])
    except ValueError as exc:
        raise DatasetError(f"{where}: {exc}") from None
    reply = after["content"] if after and after["role"] == "assistant" else None
    return Conversation(tuple(turns[: last + 1]), reply, prio)


def load_conversations(path: str | Path) -> list[Conversation]:
    p = Path(path)
    if not p.is_file():
        raise DatasetError(f"dataset {path}: no such file")
    out = []
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{n}: not JSON ({exc.msg})") from None
            conv = parse_conversation(obj, f"{path}:{n}")
            if conv is not None:
                out.append(conv)
    if not out:
        raise DatasetError(f"dataset {path}: no conversation with a user turn")
    return out


class DatasetSource:
    """Conversations a user brings, in a seeded shuffled order (cycling). A line's `priority`
    sets its class, else the class mix decides; the reply's length sets the output length, else
    the class's output distribution does."""

    def __init__(self, convs: list[Conversation], cfg: WorkloadConfig, prompts) -> None:
        self.convs = list(convs)
        random.Random(cfg.seed).shuffle(self.convs)
        self.shapes = RandomSource(cfg, prompts)
        self.prompts = prompts

    def next(self) -> RequestSpec:
        i, prio, _n_prompt, n_out = self.shapes.shape()
        conv = self.convs[i % len(self.convs)]
        if conv.priority is not None:
            prio = conv.priority
        if conv.reply:
            n_out = max(1, self.prompts.count(conv.reply))
        text = "\n\n".join(m["content"] for m in conv.messages)
        return RequestSpec(i, prio, text, self.prompts.count(text), n_out, conv.messages)
