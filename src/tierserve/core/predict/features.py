"""What the length predictor knows of a request before it runs: its features and their keys.

Features: tenant, submitted class, ``max_tokens`` (bucketed), prompt length (bucketed), a hash of
the prompt's first ``TEMPLATE_TOKENS`` tokens (the system prompt or chat template: requests
sent through the same template share it), whether a grammar constrains the output (structured
output, forced tool calls), and the stop settings (stop strings / stop ids / ignore_eos).

Keys, finest first; a prediction uses the finest key with enough (decayed) observations:

    0. ("full", tenant, class, template, max_tokens bucket, prompt bucket, grammar, stop)
    1. ("template", tenant, class, template)
    2. ("tenant", tenant, class)
    3. ("class", class)
    4. ("global",)
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from tierserve.request import Request

TEMPLATE_TOKENS = 32  # a prompt's first tokens that identify its system prompt or template
LEVELS = ("full", "template", "tenant", "class", "global")


def pow2_bucket(n: int) -> int:
    """0 for 0, else the exponent of the next power of two at or above `n` (1 -> 0, 2 -> 1,
    3..4 -> 2, ...): coarse enough to share, fine enough to separate 64 from 4096."""
    return 0 if n <= 1 else math.ceil(math.log2(n))


def template_hash(prompt_token_ids) -> str:
    """A short hash of the first TEMPLATE_TOKENS prompt tokens (all but the last token of a
    shorter prompt, so two one-line questions do not share a 'template' by their whole text)."""
    n = len(prompt_token_ids)
    k = min(TEMPLATE_TOKENS, max(0, n - 1))
    head = ",".join(str(t) for t in prompt_token_ids[:k])
    return hashlib.blake2b(head.encode(), digest_size=6).hexdigest()


@dataclass(frozen=True)
class Features:
    tenant: str
    cls: int
    template: str
    max_tokens: int
    prompt_tokens: int
    constrained: bool
    stop: str

    @classmethod
    def of(cls, request: Request) -> Features:
        sp = request.sampling_params
        stop = (
            "ignore_eos" if sp.ignore_eos else ("stop" if sp.stop or sp.stop_token_ids else "eos")
        )
        return cls(
            tenant=request.tenant,
            cls=int(request.base_priority),
            template=template_hash(request.prompt_token_ids),
            max_tokens=sp.max_tokens,
            prompt_tokens=request.num_prompt_tokens,
            constrained=sp.grammar is not None,
            stop=stop,
        )

    def key_chain(self) -> tuple[str, ...]:
        """The keys of LEVELS, finest first, as strings (they are JSON object keys)."""
        c = str(self.cls)
        full = (
            "full",
            self.tenant,
            c,
            self.template,
            str(pow2_bucket(self.max_tokens)),
            str(pow2_bucket(self.prompt_tokens)),
            "g" if self.constrained else "-",
            self.stop,
        )
        return (
            "|".join(full),
            "|".join(("template", self.tenant, c, self.template)),
            "|".join(("tenant", self.tenant, c)),
            "|".join(("class", c)),
            "global",
        )
