"""Speculative decoding's decisions, torch-free: who drafts how many tokens this step (`rule`),
the n-gram prompt-lookup drafter (`ngram`; a draft model's drafts are proposed by the
executor, executor/draft_model.py), and the measured acceptance per class (`Speculation`).
The executor verifies drafts; the scheduler schedules them as a short multi-token query of the
request and takes back the slots of rejected ones (core/scheduler.py)."""

from tierserve.core.speculation.config import SpecConfig, parse_speculative_config, with_draft_model
from tierserve.core.speculation.ngram import propose_ngram
from tierserve.core.speculation.rule import expected_tokens, pick_draft_len
from tierserve.core.speculation.speculation import DRAFT_PENDING, SpecStepStats, Speculation

__all__ = [
    "DRAFT_PENDING",
    "SpecConfig",
    "SpecStepStats",
    "Speculation",
    "expected_tokens",
    "parse_speculative_config",
    "pick_draft_len",
    "propose_ngram",
    "with_draft_model",
]
