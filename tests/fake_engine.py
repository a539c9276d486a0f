"""A whole server stack without a model: the real scheduler, KV manager, policies, AsyncEngine,
admission, metrics and FastAPI app, over the KV-simulating FakeExecutor and a tiny word-level
tokenizer. Fast enough for contract, stress and soak tests of everything but the model."""

from __future__ import annotations

import time
from types import SimpleNamespace

from tokenizers import Tokenizer, models, pre_tokenizers

from tierserve.clock import WallClock
from tierserve.config import CacheConfig, PartitionConfig, PolicyConfig, SchedulerConfig
from tierserve.engine.args import EngineArgs
from tierserve.engine.builder import BuiltEngine
from tierserve.engine.core import EngineCore
from tierserve.executor.fake import FakeExecutor
from tierserve.model.tokenizer import ChatTokenizer

VOCAB = 1000
EOS = 999
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}assistant {% endif %}"
)


def tiny_tokenizer() -> ChatTokenizer:
    """Words w0..w998 plus an end token; unknown words map to w0."""
    vocab = {f"w{i}": i for i in range(VOCAB - 1)} | {"</s>": EOS}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return ChatTokenizer(tk, CHAT_TEMPLATE, bos_token=None, eos_token="</s>")


def words(n: int, start: int = 1) -> str:
    """A prompt of exactly `n` tokens."""
    return " ".join(f"w{(start + i) % (VOCAB - 1)}" for i in range(n))


class SlowFakeExecutor(FakeExecutor):
    """FakeExecutor whose steps take `step_s` of wall time, like a model would."""

    def __init__(self, *a, step_s: float = 0.0, **kw) -> None:
        super().__init__(*a, vocab_size=VOCAB, **kw)
        self.step_s = step_s
        self.last_swap_seconds = (0.0, 0.0)

    def execute(self, out):
        if self.step_s:
            time.sleep(self.step_s)
        return super().execute(out)


def fake_built(
    num_blocks: int = 64,
    block_size: int = 4,
    max_num_seqs: int = 8,
    budget: int = 256,
    policy: str = "hybrid",
    step_s: float = 0.002,
    partitions: PartitionConfig | None = None,
    max_model_len: int = 4096,
    executor: FakeExecutor | None = None,
    tokenizer: ChatTokenizer | None = None,
    eos: int = EOS,
) -> BuiltEngine:
    """The fake stack; `executor` (built for `num_blocks` x `block_size`), `tokenizer` and
    `eos` replace the defaults."""
    ex = executor or SlowFakeExecutor(num_blocks, block_size, step_s=step_s)
    parts = partitions or PartitionConfig()
    core = EngineCore.build(
        ex,
        WallClock(),
        CacheConfig(block_size, num_blocks, partitions=parts),
        SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=budget,
            max_model_len=max_model_len,
            p0_express="exclusive",
            check_invariants=True,
        ),
        PolicyConfig(name=policy),
    )
    args = EngineArgs(
        num_kv_blocks=num_blocks,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        partitions=parts,
        policy=PolicyConfig(name=policy),
    )
    return BuiltEngine(
        engine=core,
        tokenizer=tokenizer or tiny_tokenizer(),
        model_config=SimpleNamespace(eos_token_ids=(eos,)),
        model_name="fake",
        executor=ex,
        args=args,
    )
