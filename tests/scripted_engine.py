"""A fake stack whose model says what the test wants: a character-level tokenizer (so any ASCII
text is a token sequence, and the tool-call tags are one token each) and an executor that
answers every request with a scripted text, then EOS, recording the prompts it was given.
Exercises the API's text handling (templates, tool calls, prompts) without a model."""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from tests.fake_engine import SlowFakeExecutor, fake_built
from tierserve.engine.builder import BuiltEngine
from tierserve.model.tokenizer import ChatTokenizer

CHARS = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
SPECIAL = ["<s>", "</s>"]
ADDED = ["<tool_call>", "</tool_call>"]


def char_tokenizer(template: str | None = None) -> ChatTokenizer:
    vocab = {c: i for i, c in enumerate(["<unk>", *CHARS])}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tk.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED])
    return ChatTokenizer(tk, template, bos_token="<s>", eos_token="</s>")


class ScriptedExecutor(SlowFakeExecutor):
    """Every request's output is `self.reply` (set by the test), then EOS."""

    def __init__(self, tokenizer: ChatTokenizer, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size, step_s=0.001)
        self.tk = tokenizer
        self.eos = tokenizer.tokenizer.token_to_id("</s>")
        self.reply = ""
        self.prompts: dict[str, list[int]] = {}
        self._sent: dict[str, int] = {}

    def prompt_text(self, request_id_prefix: str) -> str:
        """The prompt the engine got for the (first) request whose id starts so."""
        rid = min(r for r in self.prompts if r.startswith(request_id_prefix))
        return self.tk.decode(self.prompts[rid], skip_special_tokens=False)

    def execute(self, out):
        for new in out.scheduled_new:
            self.prompts.setdefault(new.request_id, list(new.token_ids))
        result = super().execute(out)
        script = self.tk.encode(self.reply, add_special_tokens=False)
        for rid in list(result.sampled_token_ids):
            k = self._sent.get(rid, 0)
            self._sent[rid] = k + 1
            tok = script[k] if k < len(script) else self.eos
            self.states[rid].tokens[-1] = tok  # what the fake KV will hold next step
            result.sampled_token_ids[rid] = tok
        return result


def scripted_built(template: str | None = None) -> BuiltEngine:
    tk = char_tokenizer(template)
    num_blocks, block_size = 1024, 16
    ex = ScriptedExecutor(tk, num_blocks, block_size)
    return fake_built(
        num_blocks=num_blocks,
        block_size=block_size,
        budget=2048,
        executor=ex,
        tokenizer=tk,
        eos=ex.eos,
    )
