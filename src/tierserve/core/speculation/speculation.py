"""The scheduler's speculation state: the configuration, the drafter, and acceptance measured
per class (an exponentially weighted count of drafted and accepted tokens)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tierserve.core.speculation.config import SpecConfig
from tierserve.core.speculation.ngram import propose_ngram

if TYPE_CHECKING:
    from tierserve.request import Request

# tokens so far, the most drafts wanted -> drafts
Drafter = Callable[[list[int], int], list[int]]

# A request's own acceptance: its decayed counts (weight REQUEST_DECAY per verification, so the
# last few verifications decide) against REQUEST_PRIOR drafts at its class's rate.
REQUEST_DECAY = 0.7
REQUEST_PRIOR = 3.0

# A draft the executor fills in: with a draft model (method "draft_model") the scheduler plans
# how many drafts each request verifies (the rule, the slots), and the executor's draft model
# proposes them just before the verification step (executor/draft_model.py).
DRAFT_PENDING = -1


def pending_drafts(tokens: list[int], k: int) -> list[int]:
    """k drafts to be proposed by the executor's draft model."""
    return [DRAFT_PENDING] * k


@dataclass
class SpecCounts:
    """Per class, since the start: drafted, accepted and emitted tokens (emitted: accepted
    drafts plus the token each verification samples), and verification steps."""

    drafted: list[int] = field(default_factory=lambda: [0] * 4)
    accepted: list[int] = field(default_factory=lambda: [0] * 4)
    emitted: list[int] = field(default_factory=lambda: [0] * 4)
    verifications: list[int] = field(default_factory=lambda: [0] * 4)


@dataclass(frozen=True)
class SpecStepStats:
    """Per class: (drafted, accepted, emitted, verifications) in one step, and since the start
    (the same four)."""

    step: tuple[tuple[int, int, int, int], ...]
    total: tuple[tuple[int, int, int, int], ...]


class Speculation:
    def __init__(
        self,
        config: SpecConfig,
        drafter: Drafter | None = None,
        decay: float = 0.98,
        draft_pass_s: Callable[[], float] | None = None,
    ):
        self.config = config
        # Seconds one pass of a draft model takes (each draft token of a step costs one pass,
        # shared by every request drafting in it); None: drafts cost nothing to propose.
        self.draft_pass_s = draft_pass_s or (lambda: 0.0)
        if drafter is None:
            drafter = self._ngram if config.method == "ngram" else pending_drafts
        self.drafter = drafter
        self.decay = decay
        # Decayed sums of drafts compared and accepted. Drafts after the first rejected one are
        # never compared (verification stops there), so acceptance per compared draft is the
        # per-draft rate `a` of the rule's geometric model.
        self._compared = [0.0] * 4
        self._accepted = [0.0] * 4
        self.counts = SpecCounts()
        self._step = [[0, 0, 0, 0] for _ in range(4)]  # since the last take_step()

    def _ngram(self, tokens: list[int], k: int) -> list[int]:
        c = self.config
        return propose_ngram(tokens, k, c.prompt_lookup_max, c.prompt_lookup_min)

    def acceptance(self, priority: int) -> float:
        """Measured per-draft acceptance of the class, pulled toward the prior while few drafts
        were verified (as if 8 prior drafts had been)."""
        prior, w = self.config.prior_acceptance, 8.0
        return (self._accepted[priority] + prior * w) / (self._compared[priority] + w)

    def acceptance_of(self, request: Request) -> float:
        """The request's own recent acceptance, pulled toward its class's (as if
        `REQUEST_PRIOR` drafts had been compared at the class's rate). Acceptance comes in
        phases: measured on the grounded prompts at 4 streams (Zen 3 EPYC), a verification
        after one whose drafts were all accepted accepts 0.91 of its compared drafts, after one
        that accepted none 0.74; on open chat 0.91 against 0.45. The class's rate alone
        predicts those outcomes worse (log-likelihood per compared draft -0.434 and -0.561,
        against -0.415 and -0.466 with this blend)."""
        cls = self.acceptance(request.base_priority)
        compared, accepted = request.spec_recent
        return (accepted + cls * REQUEST_PRIOR) / (compared + REQUEST_PRIOR)

    def observe_request(self, request: Request, drafted: int, accepted: int) -> None:
        """One verification of `request`'s drafts: its counts, its class's rate and its own
        (the class it was submitted with, as every per-class figure: aging moves no counts)."""
        request.num_draft_tokens += drafted
        request.num_accepted_tokens += accepted
        compared = self.observe(request.base_priority, drafted, accepted, accepted + 1)
        c, a = request.spec_recent
        request.spec_recent = (c * REQUEST_DECAY + compared, a * REQUEST_DECAY + accepted)

    def observe(self, priority: int, drafted: int, accepted: int, emitted: int) -> int:
        """One verification in class `priority`. Returns the drafts compared."""
        compared = accepted + (accepted < drafted)
        d = self.decay**compared
        self._compared[priority] = self._compared[priority] * d + compared
        self._accepted[priority] = self._accepted[priority] * d + accepted
        st = self._step[priority]
        st[0] += drafted
        st[1] += accepted
        st[2] += emitted
        st[3] += 1
        c = self.counts
        c.drafted[priority] += drafted
        c.accepted[priority] += accepted
        c.emitted[priority] += emitted
        c.verifications[priority] += 1
        return compared

    def take_step(self) -> SpecStepStats | None:
        """What was verified since the last call (None: nothing), with the totals."""
        if not any(st[3] for st in self._step):
            return None
        step = tuple(tuple(st) for st in self._step)
        self._step = [[0, 0, 0, 0] for _ in range(4)]
        c = self.counts
        total = tuple(
            (c.drafted[q], c.accepted[q], c.emitted[q], c.verifications[q]) for q in range(4)
        )
        return SpecStepStats(step, total)
