"""`--workload heavy-tail`: the simulator's heavy-tailed mix (sim/heavy_tail.py) as real requests.

The draws are the simulator's own (``HeavyTailWorkload.draw``: class, template, prompt length,
output length, seeded), on its templates scaled by the length preset (`cpu`: x0.1, `sim`: x1)
and ``--length-scale``. Each request:

* comes from its template's **tenant** (tenant-0 .. tenant-3): its ``--tenant-key`` as the
  Bearer key, else the ``x-tenant-id`` header (tierserve with authentication off);
* starts with its **template's system prompt** (the same text for every request of the template,
  ``system_tokens`` long; as a system message in chat, the head of the prompt in completions),
  then a user message of its own ("Request N. " and corpus text);
* asks for the template's generous ``max_tokens`` (4096 x scale; the classifier's 32 x scale);
* **ends at the drawn length by EOS**: ``min_tokens`` = drawn - 1 masks EOS until then, and
  ``logit_bias`` {EOS: +100} makes it the next token (client.py ``_end_at``). The server finishes
  it with reason ``stop`` after exactly the drawn number of tokens (EOS included).

What the server's length predictor sees is what a real deployment gives it: tenant, class,
template (the prompt's first tokens), ``max_tokens``, prompt length, grammar, stop settings
(core/predict/features.py). ``min_tokens`` and ``logit_bias`` are in the request, as any client
may send them, but are not predictor features: the drawn length reaches the predictor only as
the length the request really had when it ends. The drawn length is at least 2 (one token of
text before EOS, so every request has a first token to time).
"""

from __future__ import annotations

from tierserve.loadgen.workload import RequestSpec
from tierserve.workloads.heavy_tail import (
    SYSTEM_TOKENS,
    TEMPLATES,
    HeavyTailWorkload,
    Template,
    scaled,
)
from tierserve.workloads.synthetic import WorkloadConfig

PRESET_SCALE = {"sim": 1.0, "cpu": 0.1}
MIN_SYSTEM_TOKENS = 40  # > the predictor's 32 template tokens, with the chat template's head


def system_tokens(scale: float) -> int:
    return max(MIN_SYSTEM_TOKENS, min(SYSTEM_TOKENS, round(SYSTEM_TOKENS * scale)))


class HeavyTailSource:
    """The seeded sequence of heavy-tailed requests; text from `prompts` (a PromptMaker), the
    user messages seeded by `text_seed`, the system prompts by template alone."""

    def __init__(
        self, cfg: WorkloadConfig, prompts, scale: float, text_seed: str | int | None = None
    ) -> None:
        self.templates = scaled(TEMPLATES, scale)
        self.prompts = prompts
        self.text_seed = cfg.seed if text_seed is None else text_seed
        self.system_tokens = system_tokens(scale)
        self._wl = HeavyTailWorkload(cfg, self.templates)
        self._system: dict[str, str] = {}

    def system_prompt(self, t: Template) -> str:
        if t.name not in self._system:
            tag = f"You are the {t.name} assistant of {t.tenant}. "
            text = self.prompts.make(self.system_tokens, 0, f"template:{t.name}", tag=tag)
            self._system[t.name] = text
        return self._system[t.name]

    def next(self) -> RequestSpec:
        d = self._wl.draw(self.system_tokens)
        t = d.template
        system = self.system_prompt(t)
        user = self.prompts.make(d.prompt_tokens - self.system_tokens, d.index, self.text_seed)
        messages = ({"role": "system", "content": system}, {"role": "user", "content": user})
        return RequestSpec(
            index=d.index,
            priority=t.priority,
            prompt=f"{system}\n\n{user}",
            prompt_tokens=d.prompt_tokens,
            max_tokens=t.max_tokens,
            messages=messages,
            tenant=t.tenant,
            template=t.name,
            stop_after=min(t.max_tokens, max(2, d.output_tokens)),
        )


def template_table(scale: float) -> dict:
    """What results.json records of the templates (after scaling)."""
    return {
        t.name: {
            "tenant": t.tenant,
            "class": t.priority.label,
            "max_tokens": t.max_tokens,
            "prompt_median": t.prompt.median,
            "output_median": t.output.median,
            "output_sigma": t.output.sigma,
            "tail_median": t.tail.median if t.tail else None,
            "tail_share": t.tail_share,
        }
        for t in scaled(TEMPLATES, scale)
    }
