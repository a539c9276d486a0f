"""A heavy-tailed workload: output lengths by tenant and template, some predictable, some not.

Every request goes through a *template* (a system prompt of ``SYSTEM_TOKENS`` tokens of its
own, so the predictor's template hash tells them apart, and prefix caching shares it). Each
template draws its output length from a lognormal or a two-part mixture; clients set a generous
``max_tokens`` (4096, except the classifier's 32), so ``max_tokens`` says little and the real
length is only known once the request ends: the simulated model samples EOS at the drawn length
(``Workload.output_lengths``, read by SimExecutor).

| tenant   | class | template  | share | output length                     | predictable  |
|----------|-------|-----------|-------|-----------------------------------|--------------|
| tenant-0 | P0    | assistant | 1.0   | lognormal median 60, sigma 0.3    | yes          |
| tenant-0 | P1    | faq       | 0.3   | lognormal median 40, sigma 0.2    | yes          |
| tenant-0 | P1    | summary   | 0.2   | lognormal median 350, sigma 0.2   | yes          |
| tenant-2 | P1    | agent     | 0.3   | 75% median 30 / 25% median 1500   | no (bimodal) |
| tenant-3 | P1    | chat      | 0.2   | lognormal median 200, sigma 1.2   | no (tail)    |
| tenant-1 | P2    | classify  | 0.7   | median 8, sigma 0.3 (max 32)      | yes          |
| tenant-1 | P2    | report    | 0.3   | lognormal median 1200, sigma 0.15 | yes          |
| tenant-1 | P3    | eval      | 1.0   | lognormal median 600, sigma 0.8   | partly       |

("share": of its class's requests.)

Prompts: lognormal per template (the system prompt included), as in the default classes.

``HeavyTailWorkload.draw`` is the one seeded draw (class, template, prompt and output length);
the simulator turns it into token ids here, ``bench serve`` into text and a request that ends
at the drawn length (loadgen/heavy_tail.py). ``scaled`` shortens every length for a CPU.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from tierserve.priority import Priority
from tierserve.request import Request
from tierserve.sampling_params import SamplingParams
from tierserve.workloads.synthetic import SIM_EOS, LengthDist, Workload, WorkloadConfig

SYSTEM_TOKENS = 64


@dataclass(frozen=True)
class Template:
    name: str
    tenant: str
    priority: Priority
    share: float  # of its class's requests
    prompt: LengthDist
    output: LengthDist
    tail: LengthDist | None = None  # a mixture: this part ...
    tail_share: float = 0.0  # ... with this probability
    max_tokens: int = 4096

    def sample_output(self, rng: random.Random) -> int:
        d = self.tail if self.tail is not None and rng.random() < self.tail_share else self.output
        return min(self.max_tokens, d.sample(rng))


def _ln(median: float, sigma: float, lo: int = 1, hi: int = 4096) -> LengthDist:
    return LengthDist(median, sigma, lo, hi)


P = Priority
TEMPLATES: tuple[Template, ...] = (
    Template("assistant", "tenant-0", P.P0, 1.0, _ln(600, 0.6, 128, 4096), _ln(60, 0.3)),
    Template("faq", "tenant-0", P.P1, 0.3, _ln(800, 0.5, 128, 4096), _ln(40, 0.2)),
    Template("summary", "tenant-0", P.P1, 0.2, _ln(2500, 0.4, 256, 8192), _ln(350, 0.2)),
    Template(
        "agent",
        "tenant-2",
        P.P1,
        0.3,
        _ln(1500, 0.5, 128, 8192),
        _ln(30, 0.4),
        _ln(1500, 0.3),
        1 / 4,
    ),
    Template("chat", "tenant-3", P.P1, 0.2, _ln(1000, 0.7, 128, 8192), _ln(200, 1.2)),
    Template("classify", "tenant-1", P.P2, 0.7, _ln(700, 0.5, 128, 4096), _ln(8, 0.3), None, 0, 32),
    Template("report", "tenant-1", P.P2, 0.3, _ln(1500, 0.5, 256, 8192), _ln(1200, 0.15)),
    Template("eval", "tenant-1", P.P3, 1.0, _ln(1500, 0.6, 256, 8192), _ln(600, 0.8)),
)


def _scaled_dist(d: LengthDist, f: float) -> LengthDist:
    return LengthDist(d.median * f, d.sigma, max(1, round(d.lo * f)), max(1, round(d.hi * f)))


def scaled(templates: tuple[Template, ...], f: float) -> tuple[Template, ...]:
    """`templates` with every prompt and output length (medians, bounds, ``max_tokens``)
    multiplied by `f` (``max_tokens`` at least 16), the shapes and shares unchanged."""
    if f <= 0:
        raise ValueError(f"the length scale must be positive, got {f}")
    if f == 1:
        return templates
    return tuple(
        replace(
            t,
            prompt=_scaled_dist(t.prompt, f),
            output=_scaled_dist(t.output, f),
            tail=_scaled_dist(t.tail, f) if t.tail is not None else None,
            max_tokens=max(16, round(t.max_tokens * f)),
        )
        for t in templates
    )


@dataclass(frozen=True)
class Draw:
    index: int  # position in the seeded sequence
    template: Template
    prompt_tokens: int  # the system prompt included
    output_tokens: int  # where the model ends (by EOS), at most the template's max_tokens


class HeavyTailWorkload(Workload):
    """`cfg` gives the class mix, arrivals and seed; TEMPLATES give everything else."""

    def __init__(self, cfg: WorkloadConfig, templates: tuple[Template, ...] = TEMPLATES) -> None:
        super().__init__(cfg)
        self.templates = templates
        self._by_class = {c: [t for t in templates if t.priority == c] for c in Priority}
        for c in Priority:
            if cfg.mix[c] > 0 and not self._by_class[c]:
                raise ValueError(f"the heavy-tailed workload has no template of class {c.label}")

    def draw(self, system_tokens: int = SYSTEM_TOKENS) -> Draw:
        """The next request's class, template and lengths (the prompt at least one token
        longer than its `system_tokens` system prompt)."""
        rng = self.rng
        prio = self._class()
        choices = self._by_class[prio]
        t = rng.choices(choices, weights=[x.share for x in choices])[0]
        n_prompt = max(system_tokens + 1, t.prompt.sample(rng))
        n_out = max(1, t.sample_output(rng))
        uid = self._n
        self._n += 1
        return Draw(uid, t, n_prompt, n_out)

    def make(self, now: float) -> Request:
        d = self.draw()
        t, uid = d.template, d.index
        system = [200 + self.templates.index(t)] * SYSTEM_TOKENS
        body = [1000 + uid % (self.cfg.vocab_size - 1000)] * (d.prompt_tokens - SYSTEM_TOKENS)
        rid = f"sim-{uid}"
        self.output_lengths[rid] = d.output_tokens
        return Request(
            rid,
            system + body,
            SamplingParams(max_tokens=t.max_tokens, temperature=0.0),
            priority=t.priority,
            tenant=t.tenant,
            arrival_time=now,
            eos_token_id=SIM_EOS,
        )
