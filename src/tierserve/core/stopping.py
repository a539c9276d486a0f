"""Stop conditions checked after each sampled token (stop strings need text and are checked by
the output processor, which then finishes the request through the engine)."""

from __future__ import annotations

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
