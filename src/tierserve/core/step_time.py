"""How long a step takes, predicted from what it computes: a plain-number model fitted online.

A step over requests ``r``, each computing ``n_r`` new tokens on top of ``c_r`` already in its
context, costs (seconds)::

    overhead + per_seq x seqs + per_token x sum n_r + per_context x sum (c_r + n_r)
             + per_pair x sum (n_r c_r + n_r (n_r + 1) / 2) + per_row x rows

``pairs`` are the (query, key) pairs attention computes: a chunk late in a long prompt pays for
the whole context before it, which is why a 512-token chunk at position 6,500 takes seconds on a
CPU while the first takes a fraction of one. ``context`` is the KV read once per request and
step (what makes a decode step at long context slow); ``rows`` are the positions whose logits
are computed (one per sampled token, every position of a prompt whose logprobs are asked for).
These are the features of the simulator's cost model (sim/cost_model.py), so the simulator's
steps are fitted exactly and the server's closely.

The coefficients are fitted by least squares over the measured steps, each weighted by
``decay`` per newer step (about the last ``1 / (1 - decay)`` steps count), pulled toward a prior
(ridge) so that a feature the recent steps did not vary still predicts something sensible: the
prior is the executor's measured prefill speed (``seed_prefill_tokens_per_s``) spread over the
features in fixed proportions, worth ``PRIOR_WEIGHT`` steps. Coefficients are kept >= 0. The
scheduler feeds it each step's features and measured duration (its injected clock: wall time in
the server, the cost model's time in the simulator), so it follows whatever the hardware and the
kernels do today. Until ``MIN_OBSERVATIONS`` steps have been measured it claims no knowledge
(``calibrated`` is False) and nothing is bounded by it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tierserve.priority import Priority

if TYPE_CHECKING:
    from tierserve.config import SchedulerConfig
    from tierserve.policies import Policy

FEATURES = ("overhead", "per_seq", "per_token", "per_context", "per_pair", "per_row")
NF = len(FEATURES)
# Feature scales (a typical step's size), so that the normal equations are well conditioned.
_SCALE = (1.0, 8.0, 512.0, 8192.0, 512.0 * 2048.0, 8.0)
# The prior's share of one prefill token's time, per feature, relative to per_token.
_PRIOR_RATIO = (0.0, 0.0, 1.0, 1.0 / 64.0, 1.0 / 4096.0, 1.0 / 4.0)
PRIOR_WEIGHT = 2.0
PREFILL_SHARE = 0.5  # of the step bound that prefill chunks may use whatever the decodes take
P0_WAIT_SHARE = 0.5  # of the bound kept free of other prefill while a strict class waits
EXPRESS_WINDOW_S = 5.0  # express steps' share of the engine's time is measured over this
MIN_OBSERVATIONS = 1


@dataclass(frozen=True)
class StepWork:
    """What one step (or part of one) computes: the model's features."""

    seqs: int = 0
    tokens: int = 0
    context: int = 0
    pairs: float = 0.0
    rows: int = 0

    @staticmethod
    def chunk(n: int, computed: int, rows: int) -> StepWork:
        """One request computing `n` tokens after `computed`, `rows` of them with logits."""
        return StepWork(1, n, computed + n, n * computed + n * (n + 1) / 2, rows)

    def __add__(self, other: StepWork) -> StepWork:
        return StepWork(
            self.seqs + other.seqs,
            self.tokens + other.tokens,
            self.context + other.context,
            self.pairs + other.pairs,
            self.rows + other.rows,
        )

    def vector(self) -> tuple[float, ...]:
        return (1.0, self.seqs, self.tokens, self.context, self.pairs, self.rows)


@dataclass(frozen=True)
class StepCoefficients:
    """A snapshot of the fitted model: plain numbers (seconds per unit of each feature)."""

    coef: tuple[float, ...] = (0.0,) * NF
    calibrated: bool = False

    def seconds(self, work: StepWork, with_overhead: bool = True) -> float:
        x = work.vector()
        start = 0 if with_overhead else 1
        return sum(self.coef[i] * x[i] for i in range(start, NF))

    def max_tokens(self, limit: int, computed: int, logprob_rows: bool, seconds: float) -> int:
        """The most tokens (<= `limit`) one request can compute after `computed` within
        `seconds` (its share of a step, the overhead excluded). One row of logits is counted
        for the chunk (its sampled token), and one per token when `logprob_rows` (prompt
        logprobs)."""
        _, s, t, ctx, p, r = self.coef
        # cost(m) = s + ctx computed + r + (t + ctx + p (computed + 1/2) + r lp) m + p m^2 / 2
        a = p / 2.0
        b = t + ctx + p * (computed + 0.5) + (r if logprob_rows else 0.0)
        room = seconds - s - ctx * computed - r
        if room <= 0:
            return 0
        if a <= 0:
            m = limit if b <= 0 else int(room / b)
        else:
            m = int((-b + (b * b + 4 * a * room) ** 0.5) / (2 * a))
        return max(0, min(limit, m))


class StepTimeModel:
    def __init__(self, seed_prefill_tokens_per_s: float | None = None, decay: float = 0.99):
        self.decay = decay
        per_token = 1.0 / seed_prefill_tokens_per_s if seed_prefill_tokens_per_s else 0.0
        self._prior = [per_token * _PRIOR_RATIO[i] * _SCALE[i] for i in range(NF)]
        self._xx = [[0.0] * NF for _ in range(NF)]  # decayed sums of x x^T (scaled features)
        self._xy = [0.0] * NF
        self.observations = 0
        self._coef = StepCoefficients(tuple(self._prior[i] / _SCALE[i] for i in range(NF)))

    @property
    def coefficients(self) -> StepCoefficients:
        return self._coef

    @property
    def calibrated(self) -> bool:
        return self._coef.calibrated

    def predict(self, work: StepWork) -> float:
        return self._coef.seconds(work)

    def observe(self, work: StepWork, seconds: float) -> None:
        """Fit one measured step. A step that measured no time (a manual clock nobody moved)
        or computed nothing teaches nothing and is skipped."""
        if seconds <= 0 or work.tokens <= 0:
            return
        x = [v / s for v, s in zip(work.vector(), _SCALE, strict=True)]
        d = self.decay
        for i in range(NF):
            row = self._xx[i]
            for j in range(NF):
                row[j] = d * row[j] + x[i] * x[j]
            self._xy[i] = d * self._xy[i] + x[i] * seconds
        self.observations += 1
        theta = _nonnegative_ridge(self._xx, self._xy, self._prior, PRIOR_WEIGHT)
        self._coef = StepCoefficients(
            tuple(theta[i] / _SCALE[i] for i in range(NF)),
            calibrated=self.observations >= MIN_OBSERVATIONS,
        )


def _nonnegative_ridge(
    xx: list[list[float]], xy: list[float], prior: list[float], weight: float
) -> list[float]:
    """argmin ||X theta - y||^2 + weight ||theta - prior||^2 with theta >= 0 (active set: a
    coefficient the unconstrained solution makes negative is fixed at 0 and the rest refitted)."""
    free = list(range(NF))
    theta = [0.0] * NF
    while free:
        a = [[xx[i][j] + (weight if i == j else 0.0) for j in free] for i in free]
        b = [xy[i] + weight * prior[i] for i in free]
        sol = _solve(a, b)
        worst = min(range(len(free)), key=lambda k: sol[k])
        if sol[worst] >= 0:
            for k, i in enumerate(free):
                theta[i] = sol[k]
            return theta
        free.pop(worst)
    return theta


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (a is symmetric positive definite here)."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[piv] = m[piv], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    out = [0.0] * n
    for r in range(n - 1, -1, -1):
        out[r] = (m[r][n] - sum(m[r][c] * out[c] for c in range(r + 1, n))) / m[r][r]
    return out


class TimeBudget:
    """The time a step being planned may still take: the bound minus the predicted time of what
    is in it so far. Inactive (nothing is cut) without a bound, before the model has been
    calibrated by measured steps, or when an empty step is predicted to take longer than the
    bound (a machine that slow cannot meet it: cutting prompts into more steps would only add
    steps). However short the time left, the first prefill chunk of a step gets at least
    `min_chunk` tokens, so a long prompt always makes progress."""

    def __init__(self, coef: StepCoefficients, bound_s: float | None, min_chunk: int) -> None:
        self.coef = coef
        self.active = bound_s is not None and coef.calibrated and coef.coef[0] < bound_s
        self.bound = bound_s or 0.0
        self.left = self.bound - coef.coef[0]
        self.fixed = 0.0  # decodes counted so far
        self.min_chunk = min_chunk
        self.chunks = 0  # prefill chunks planned so far

    def cost(self, work: StepWork) -> float:
        return self.coef.seconds(work, with_overhead=False)

    def take(self, work: StepWork, chunk: bool) -> None:
        self.left -= self.cost(work)
        self.fixed += 0.0 if chunk else self.cost(work)
        self.chunks += chunk

    def give_back(self, work: StepWork, chunk: bool) -> None:
        self.left += self.cost(work)
        self.fixed -= 0.0 if chunk else self.cost(work)
        self.chunks -= chunk

    def fit(self, n: int, computed: int, logprob_rows: bool, reserve: float = 0.0) -> int:
        """Of `n` prefill tokens after `computed`, how many fit in the time left, keeping
        `reserve` seconds for work that must still come into the step."""
        if not self.active or n <= 1:
            return n
        # Prefill always gets PREFILL_SHARE of the bound, even when the decodes alone fill it
        # (the step then ends later, but prompts keep flowing in).
        floor = PREFILL_SHARE * self.bound - (
            self.bound - self.coef.coef[0] - self.fixed - self.left
        )
        left = max(self.left, floor)
        m = self.coef.max_tokens(n, computed, logprob_rows, left - reserve)
        if m == 0 and self.chunks == 0 and reserve <= 0:  # (with a reserve, the step is not
            m = min(n, self.min_chunk)  # empty: the work it is kept for comes)
        return m


def step_bound(config: SchedulerConfig, policy: Policy, p0_recent: bool = False) -> float | None:
    """The longest a step may be predicted to take: ``step_time_fraction`` x P0's TTFT SLA,
    under a policy that serves a waiting P0 first (``p0_strict``): a P0 arriving while a step
    runs waits for it, then gets its own. While a P0 arrived recently (`p0_recent`), the
    tighter ``p0_step_time_fraction`` where it is set. None (no bound) for a policy that makes
    P0 no such promise, a P0 class without an SLA, or the fraction set to None."""
    sla = policy.priorities.sla(Priority.P0)
    if not policy.traits.p0_strict or sla is None or config.step_time_fraction is None:
        return None
    fraction = config.step_time_fraction
    if p0_recent and config.p0_step_time_fraction is not None:
        fraction = min(fraction, config.p0_step_time_fraction)
    return fraction * sla


class StepBounds:
    """The step bound at a moment: ``step_bound`` with `p0_recent` while a P0 arrived within
    the last ``p0_recent_s`` (one arriving mid-step waits for the step in flight, then
    prefills in its own), the plain one otherwise."""

    def __init__(self, config: SchedulerConfig, policy: Policy) -> None:
        self.plain = step_bound(config, policy)
        self.p0_about = step_bound(config, policy, p0_recent=True)
        self.recent_s = config.p0_recent_s

    def at(self, now: float, last_p0: float) -> float | None:
        return self.p0_about if now - last_p0 <= self.recent_s else self.plain


class ExpressShare:
    """The share of the engine's time spent in P0 express steps, over the last ~`window_s`
    (both sums decay with time): what rate-limits express steps."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._express = self._total = 0.0
        self._at: float | None = None

    def _decay(self, now: float) -> None:
        if self._at is not None and now > self._at:
            keep = math.exp(-(now - self._at) / self.window_s)
            self._express *= keep
            self._total *= keep
        self._at = now if self._at is None else max(self._at, now)

    def add(self, seconds: float, express: bool, now: float) -> None:
        """One step of `seconds` (at least a microsecond: on a clock that does not move during
        steps, each counts the same, and the share is one of steps)."""
        self._decay(now)
        seconds = max(seconds, 1e-6)
        self._total += seconds
        self._express += seconds if express else 0.0

    def share(self, now: float) -> float:
        self._decay(now)
        return self._express / self._total if self._total > 0 else 0.0
