"""The offline API: ``tierserve.LLM(model=None).generate(prompts, SamplingParams, priority=...)``
runs the full engine (scheduler, KV cache manager, executor) in the calling thread."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

from tierserve.chat.prompt import ChatPrompter
from tierserve.engine.args import EngineArgs
from tierserve.engine.builder import build_engine
from tierserve.engine.output_processor import OutputProcessor
from tierserve.priority import Priority, parse_priority
from tierserve.request import Request
from tierserve.sampling_params import SamplingParams

Prompt = str | list[int] | list[dict]


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None
    priority: Priority
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list = field(default_factory=list)  # with SamplingParams.top_logprobs
    prompt_logprobs: list = field(default_factory=list)  # with prompt_logprobs
    num_preemptions: int = 0
    error: str | None = None


class LLM:
    def __init__(self, model: str | None = None, **kwargs) -> None:
        """`kwargs` are EngineArgs fields (kv_cache_gib, max_num_seqs, policy, device, ...)."""
        kwargs.setdefault("kv_cache_gib", 0.25)
        kwargs.setdefault("swap_space_gib", 0.0)
        built = build_engine(EngineArgs(model=model, **kwargs))
        self.engine = built.engine
        self.tokenizer = built.tokenizer
        self.chat = ChatPrompter(built.tokenizer)
        self.model_config = built.model_config
        self.executor = built.executor
        self._ids = itertools.count()

    def close(self) -> None:
        """Stop what the engine started beside this process (tensor-parallel workers)."""
        self.executor.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        if prompt and isinstance(prompt[0], dict):  # content always present, as in the API
            messages = [{**m, "content": m.get("content") or ""} for m in prompt]
            return self.chat.encode(self.chat.render(messages))
        return list(prompt)

    def generate(
        self,
        prompts: Prompt | list[Prompt],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        priority: Priority | int | str | list = Priority.P1,
    ) -> list[RequestOutput]:
        """Generate for one prompt or many: text, token ids, or chat messages (a list of
        {"role", "content"} dicts). Returns outputs in the order of the prompts."""
        single = isinstance(prompts, str) or (
            isinstance(prompts, list) and prompts and not isinstance(prompts[0], str | list)
        )
        batch = [prompts] if single else list(prompts)
        params = sampling_params or SamplingParams()
        params = params if isinstance(params, list) else [params] * len(batch)
        prios = priority if isinstance(priority, list) else [priority] * len(batch)
        eos = self.model_config.eos_token_ids
        proc = OutputProcessor(self.tokenizer)
        reqs = []
        for prompt, sp, prio in zip(batch, params, prios, strict=True):
            if eos and not sp.ignore_eos:
                sp = replace(sp, stop_token_ids=tuple({*sp.stop_token_ids, *eos[1:]}))
            req = Request(
                f"llm-{next(self._ids)}",
                self._encode(prompt),
                sp,
                priority=parse_priority(prio),
                arrival_time=self.engine.clock.now(),
                eos_token_id=eos[0] if eos else None,
            )
            self.engine.add_request(req)
            proc.add(req)
            reqs.append(req)
        seen = {r.request_id: 0 for r in reqs}
        while self.engine.has_unfinished():
            for req in self.engine.step():
                new = req.output_token_ids[seen[req.request_id] :]
                seen[req.request_id] = req.num_output_tokens
                _, stopped = proc.process(req, new, req.is_finished)
                if stopped and not req.is_finished:
                    self.engine.finish_request(req.request_id, "stop")
                if stopped:  # as the server does (engine/async_engine.py)
                    req.truncate_output(proc.consumed(req.request_id))
        return [
            RequestOutput(
                request_id=r.request_id,
                prompt_token_ids=r.prompt_token_ids,
                text=proc.text(r.request_id),
                token_ids=list(r.output_token_ids),
                finish_reason=r.finish_reason.value if r.finish_reason else None,
                priority=r.base_priority,
                logprobs=list(r.output_logprobs),
                top_logprobs=list(r.output_top_logprobs),
                prompt_logprobs=list(r.prompt_logprobs),
                num_preemptions=r.num_preemptions,
                error=r.error,
            )
            for r in reqs
        ]
