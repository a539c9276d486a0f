"""What one step's executor output does to a running request, and the stop conditions checked
after each sampled token (stop strings need text and are checked by the output processor, which
then finishes the request through the engine)."""

from __future__ import annotations

from tierserve.core.outputs import ExecutorOutput
from tierserve.request import Request


def check_stop(req: Request, max_model_len: int) -> str | None:
    """Return "stop" or "length" when the request must finish, else None."""
    sp = req.sampling_params
    tok = req.output_token_ids[-1]
    if req.num_output_tokens >= sp.min_tokens:
        if not sp.ignore_eos and req.eos_token_id is not None and tok == req.eos_token_id:
            return "stop"
        if tok in sp.stop_token_ids:
            return "stop"
    if req.num_output_tokens >= sp.max_tokens or req.num_tokens >= max_model_len:
        return "length"
    return None


def take_output(
    req: Request, result: ExecutorOutput, now: float, max_model_len: int
) -> tuple[bool, str | None]:
    """Record what the step computed for `req` (its scheduled tokens are counted already):
    prompt logprobs, the sampled token with its logprobs. Returns (whether a token came, the
    finish reason or None). A scoring request (max_tokens 0) finishes with "length" once its
    prompt is computed, with no token, whatever the executor sampled."""
    rid = req.request_id
    if rid in result.prompt_logprobs:
        req.add_prompt_logprobs(result.prompt_logprobs[rid])
    done = req.num_computed_tokens == req.num_tokens
    if req.sampling_params.max_tokens == 0:
        return False, "length" if done else None
    tok = result.sampled_token_ids.get(rid)
    if tok is None:
        return False, None
    if not done:
        raise AssertionError(f"{rid}: sampled before all tokens were computed")
    if req.first_token_time is None:
        req.first_token_time = now
    # Accepted drafts first: each is a token whose KV this step computed (so it counts as
    # computed once taken), checked for stops like any other; a stop among them drops the rest.
    accepted = result.accepted_token_ids.get(rid, ())
    for i, draft in enumerate(accepted):
        req.append_output(
            draft, result.accepted_logprobs[rid][i], result.accepted_top_logprobs[rid][i]
        )
        req.num_computed_tokens += 1
        reason = check_stop(req, max_model_len)
        if reason is not None:
            return True, reason
    req.append_output(tok, result.logprobs.get(rid), result.top_logprobs.get(rid))
    return True, check_stop(req, max_model_len)
