"""Per-request text output: incremental detokenization and stop strings.

With stop strings, the last ``max(len(stop)) - 1`` characters are held back while the request
runs, so a stream never shows the beginning of a stop string that then matches; the matched stop
string and everything after it are cut off.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tierserve.model.tokenizer import ChatTokenizer, IncrementalDetokenizer
from tierserve.request import Request


@dataclass
class TextState:
    detok: IncrementalDetokenizer
    stop: tuple[str, ...]
    holdback: int
    text: str = ""
    emitted: int = 0
    stopped: bool = False
    token_ids: list[int] = field(default_factory=list)


class OutputProcessor:
    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self.tokenizer = tokenizer
        self._states: dict[str, TextState] = {}

    def add(self, req: Request) -> None:
        stop = req.sampling_params.stop
        self._states[req.request_id] = TextState(
            IncrementalDetokenizer(
                self.tokenizer, req.prompt_token_ids, req.sampling_params.skip_special_tokens
            ),
            stop,
            max((len(s) for s in stop), default=1) - 1,
        )

    def process(self, req: Request, new_tokens: list[int], finished: bool) -> tuple[str, bool]:
        """Feed new tokens; return (text to emit now, whether a stop string matched)."""
        st = self._states[req.request_id]
        for tok in new_tokens:
            if st.stopped:
                break
            st.token_ids.append(tok)
            delta = st.detok.add(tok)
            if not delta:
                continue
            search_from = max(0, len(st.text) - st.holdback)
            st.text += delta
            for s in st.stop:
                i = st.text.find(s, search_from)
                if i >= 0:
                    st.text = st.text[:i]
                    st.stopped = True
                    break
        done = finished or st.stopped
        upto = len(st.text) if done else max(st.emitted, len(st.text) - st.holdback)
        out = st.text[st.emitted : upto]
        st.emitted = upto
        return out, st.stopped

    def consumed(self, request_id: str) -> int:
        """Output tokens taken in so far (after a stop string matched: up to the token that
        completed it)."""
        return len(self._states[request_id].token_ids)

    def text(self, request_id: str) -> str:
        return self._states[request_id].text

    def remove(self, request_id: str) -> None:
        self._states.pop(request_id, None)
