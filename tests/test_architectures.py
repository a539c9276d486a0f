"""Every registered architecture against transformers, on a tiny random model built here from
its config and saved as a Hugging Face folder (nothing downloaded), served through the engine
(`tierserve.LLM(model=folder)`): prompt log-probabilities (the normalised logits) within
tolerance, greedy tokens equal, whole and chunked; raw logits equal on every step path the model
says it can run; one architecture through the HTTP server; an unsupported one fails at start.

Each case turns on what its architecture adds: sliding windows shorter than the prompt,
soft-capping, a score scale other than 1/sqrt(head_dim), q/k norms, partial rotary, tied
embeddings, biases, two rotary bases."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

from tierserve import LLM
from tierserve.executor.batch import build_batch
from tierserve.executor.state import RequestState
from tierserve.executor.torch_executor import TorchExecutor
from tierserve.model import registry
from tierserve.model.loader import load_model
from tierserve.model.plan import PATHS, uses_blas
from tierserve.sampling_params import SamplingParams

VOCAB = 256
WINDOW = 8  # shorter than every prompt: the windowed layers really drop keys
PROMPT = 40
NEW = 12
GREEDY = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    tie_word_embeddings=False,
    initializer_range=0.2,  # peaked logits: greedy choices far from ties
)
# architecture -> (transformers config class, settings, the step paths it must offer); float32
# products (build_model's default) never offer the bfloat16 GEMMs of the `bf16` path
EXACT = tuple(p for p in PATHS if p != "bf16")
NO_FUSED = tuple(p for p in EXACT if p != "fused")
CASES = {
    "LlamaForCausalLM": (
        "LlamaConfig",
        dict(rope_scaling={"rope_type": "linear", "factor": 2.0}),
        EXACT,
    ),
    "MistralForCausalLM": ("MistralConfig", dict(sliding_window=WINDOW), ("mixed", "torch")),
    "Qwen2ForCausalLM": (
        "Qwen2Config",
        dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
        ("mixed", "torch"),
    ),
    "Qwen3ForCausalLM": ("Qwen3Config", dict(head_dim=32, tie_word_embeddings=True), NO_FUSED),
    "Gemma2ForCausalLM": (
        "Gemma2Config",
        dict(
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=WINDOW,
            attn_logit_softcapping=2.0,
            final_logit_softcapping=3.0,
        ),
        ("mixed", "torch"),
    ),
    "Gemma3ForCausalLM": (
        "Gemma3TextConfig",
        dict(
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"],
            final_logit_softcapping=3.0,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        ),
        ("mixed", "torch"),
    ),
    "Phi3ForCausalLM": (
        "Phi3Config",
        dict(
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=1,
            original_max_position_embeddings=64,  # longer than every sequence here
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,  # 8 of 16 dimensions rotate
                "short_factor": [1.0, 1.5, 2.0, 3.0],
                "long_factor": [2.0, 4.0, 8.0, 16.0],
            },
        ),
        NO_FUSED,
    ),
}


def test_every_registered_architecture_has_a_case():
    assert set(CASES) == set(registry.ARCHITECTURES)


def word_tokenizer() -> Tokenizer:
    """One word per id ("w0" ... "w255"), so text and token ids map one to one."""
    tk = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tk


def save_tiny(folder, arch: str, seed: int = 0, **overrides):
    """A random transformers model of `arch`, saved in `folder` with a tokenizer; returns it."""
    config_name, settings, _ = CASES[arch]
    cfg = getattr(transformers, config_name)(**(COMMON | settings | overrides))
    torch.manual_seed(seed)
    hf = transformers.AutoModelForCausalLM.from_config(cfg).float().eval()
    assert type(hf).__name__ == arch
    hf.save_pretrained(folder, safe_serialization=True)
    word_tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "w1"}))
    return hf


def prompt(seed: int = 1) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, VOCAB, (PROMPT,), generator=g).tolist()


@torch.no_grad()
def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    seq = list(ids)
    for _ in range(n):
        seq.append(int(hf(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids) :]


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    arch = request.param
    folder = tmp_path_factory.mktemp(arch)
    hf = save_tiny(folder, arch)
    return arch, folder, hf


def rel_err(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def test_engine_matches_transformers_whole_and_chunked(case):
    arch, folder, hf = case
    ids = prompt()
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
    want_lp = ref[torch.arange(PROMPT - 1), torch.tensor(ids[1:])].tolist()
    want_tokens = hf_greedy(hf, ids, NEW)
    score = SamplingParams(max_tokens=0, prompt_logprobs=3)
    for chunk in (512, 16):  # whole prompt; chunks of 16 (continued chunks meet the window)
        # a float32 KV cache: compared with transformers within 1e-4 (the CPU's default
        # float16 cache moves logprobs by ~1e-3: test_kv_dtype.py)
        llm = LLM(model=str(folder), num_kv_blocks=64, max_num_batched_tokens=chunk,
                  measure_costs=False, kv_cache_dtype="float32")  # fmt: skip
        assert type(llm.executor.model).__name__ == arch
        scored = llm.generate(ids, score)[0]
        assert [lp for lp, _ in scored.prompt_logprobs] == pytest.approx(want_lp, abs=1e-4)
        for pos, (_, (top_ids, top_lps)) in enumerate(scored.prompt_logprobs):
            assert list(top_ids) == ref[pos].topk(3).indices.tolist(), (chunk, pos)
            assert list(top_lps) == pytest.approx(ref[pos].topk(3).values.tolist(), abs=1e-4)
        out = llm.generate([ids, ids[:30]], GREEDY)  # two requests decoding side by side
        assert out[0].token_ids == want_tokens, (arch, chunk)
        assert out[1].token_ids == hf_greedy(hf, ids[:30], NEW), (arch, chunk)


def run_steps(model, steps, path, prompts) -> torch.Tensor:
    """Teacher-forced steps (prefill, a chunk continuing its prefix beside another prefill,
    decodes) through one step path; the logits of every row."""
    ex = TorchExecutor(model, num_blocks=16, block_size=16, measure=False)
    for rid, toks in prompts.items():
        first = 0 if rid == "a" else 8
        ex.add_state(rid, RequestState(list(toks), len(toks), list(range(first, first + 8)), 0,
                                       GREEDY))  # fmt: skip
    outs = []
    for sched in steps:
        b = build_batch(ex.states, sched, 16, ex.tables, model.backend(path),
                        fused=path == "fused")  # fmt: skip
        rows = torch.arange(b.input_ids.shape[0])
        outs.append(model.forward(b.input_ids, b.positions, b.meta, ex.kv_caches, rows,
                                  blas=uses_blas(path)))  # fmt: skip
        for rid, n in sched.items():
            ex.states[rid].num_computed += n
    return torch.cat(outs)


def check_every_path(folder, hf, expected_paths) -> None:
    from tierserve import kernels

    ids = prompt(2) + prompt(3)[:20]  # 60 tokens, teacher-forced
    prompts = {"a": ids, "b": prompt(4)}
    steps = [{"a": 30, "b": 9}, {"a": 27, "b": 31}, {"a": 1}, {"a": 1}, {"a": 1}]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    loaded = load_model(folder)
    paths = ("torch",)
    if kernels.get() is not None:
        paths = registry.build_model(loaded.config, dict(loaded.weights)).paths(16)
        assert paths == expected_paths
    for path in paths:
        model = registry.build_model(loaded.config, dict(loaded.weights), kernels=path != "torch")
        got = run_steps(model, steps, path, prompts)
        a_rows = torch.cat([got[:30], got[39:66], got[97:]])  # request a's rows, in order
        assert rel_err(a_rows, ref) < 1e-4, path
        assert torch.equal(a_rows.argmax(-1), ref.argmax(-1)), path


def test_logits_on_every_step_path_the_model_offers(case):
    arch, folder, hf = case
    check_every_path(folder, hf, CASES[arch][2])


def test_phi3_rotating_whole_heads_runs_fused_layers_with_longrope(tmp_path):
    """LongRoPE only changes the cos/sin tables: with the whole head rotating, Phi-3's layer is
    Llama's, and the fused C++ layer runs it."""
    rope = CASES["Phi3ForCausalLM"][1]["rope_parameters"]
    whole = rope | {"partial_rotary_factor": 1.0, "short_factor": [1.0, 1.2] * 4,
                    "long_factor": [2.0, 3.0] * 4}  # fmt: skip
    hf = save_tiny(tmp_path, "Phi3ForCausalLM", rope_parameters=whole)
    check_every_path(tmp_path, hf, EXACT)


def test_longrope_takes_the_long_factors_past_the_original_context(tmp_path):
    """Inside the original context the parity tests cover LongRoPE; past it, a position's
    rotation is transformers' rotation there (its long factors and attention factor)."""
    hf = save_tiny(tmp_path, "Phi3ForCausalLM")
    model = registry.build_model(load_model(tmp_path).config, dict(load_model(tmp_path).weights))
    rope = model.ropes[0]
    assert type(rope).__name__ == "LongRope" and rope.rotary_dim == 8
    pos = torch.tensor([3, 70, 200])
    cos, sin = rope.cos_sin(pos, torch.float32)
    for i, p in enumerate(pos.tolist()):  # transformers' rotation of a sequence ending at p
        ref_cos, ref_sin = hf.model.rotary_emb(torch.zeros(1, 1, 16), torch.tensor([[p]]))
        ref_sin[..., :4] *= -1  # ours comes signed for rotate-half (`layers.rope_cos_sin`)
        assert torch.allclose(cos[i, 0], ref_cos[0, 0], atol=1e-6), p
        assert torch.allclose(sin[i, 0], ref_sin[0, 0], atol=1e-6), p


def test_one_architecture_through_the_http_server(tmp_path):
    from tests.server_utils import running_server
    from tierserve.api.settings import ServerSettings
    from tierserve.engine.args import EngineArgs
    from tierserve.engine.builder import build_engine

    hf = save_tiny(tmp_path, "Gemma3ForCausalLM")
    ids = prompt()
    want = hf_greedy(hf, ids, NEW)
    built = build_engine(EngineArgs(model=str(tmp_path), num_kv_blocks=64, measure_costs=False))
    settings = ServerSettings(served_model_names=("tiny-gemma3",))
    with running_server(built, settings) as (url, _):
        body = {"model": "tiny-gemma3", "prompt": ids, "max_tokens": NEW, "temperature": 0}
        r = httpx.post(f"{url}/v1/completions", json=body | {"ignore_eos": True}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"].split() == [f"w{t}" for t in want]
        text = "w5 w17 w3 w200 w9 w64 w31 w8 w120 w77 w6 w13"  # the same path from text
        r = httpx.post(f"{url}/v1/completions", json=body | {"prompt": text}, timeout=60)
        assert r.status_code == 200, r.text
        words = [int(w[1:]) for w in text.split()]
        got = r.json()["choices"][0]["text"].split()
        assert got == [f"w{t}" for t in hf_greedy(hf, words, len(got))] and got


def unsupported_folder(tmp_path):
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path, safe_serialization=True)
    word_tokenizer().save(str(tmp_path / "tokenizer.json"))
    return tmp_path


def test_an_unsupported_architecture_fails_at_start_naming_it_and_the_supported_list(tmp_path):
    folder = unsupported_folder(tmp_path)
    with pytest.raises(registry.UnsupportedArchitecture) as err:
        LLM(model=str(folder), measure_costs=False)
    msg = str(err.value)
    assert "GPT2LMHeadModel" in msg and str(folder) in msg
    assert all(arch in msg for arch in registry.ARCHITECTURES)
    cli = subprocess.run(
        [sys.executable, "-m", "tierserve.cli", "serve", "--model", str(folder), "--port", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert cli.returncode == 2, cli.stderr[-2000:]
    last = cli.stderr.strip().splitlines()[-1]
    assert last.startswith("tierserve serve: ") and "GPT2LMHeadModel" in last
    assert "Qwen3ForCausalLM" in last and "Traceback" not in cli.stderr


def test_a_model_type_names_its_architecture_and_nothing_else_does():
    from tierserve.model.config import ModelConfig

    cfg = ModelConfig("qwen2", VOCAB, 64, 96, 2, 4, 2, 16)
    assert cfg.architecture == "Qwen2ForCausalLM"
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(registry.UnsupportedArchitecture, match="'falcon' is not supported"):
        ModelConfig("falcon", VOCAB, 64, 96, 2, 4, 2, 16)


def write_gguf(hf, path, gguf_arch: str) -> dict[str, torch.Tensor]:
    """`hf` as a GGUF file in llama.cpp's layout, every matrix in q8_0 (Qwen's q/k are stored
    unpermuted); returns its state dict as the file holds it (q8_0 weights rounded)."""
    import gguf
    import numpy as np

    from tierserve.model.gguf_loader import _LAYER_NAMES

    c = hf.config
    to_gguf = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
    for i in range(c.num_hidden_layers):
        for short, long in _LAYER_NAMES.items():
            to_gguf[f"model.layers.{i}.{long}"] = f"blk.{i}.{short}"
    w = gguf.GGUFWriter(str(path), gguf_arch)
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_key_length(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
    w.add_rope_freq_base(c.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list([f"w{i}" for i in range(VOCAB)])
    w.add_token_types([1] * VOCAB)
    w.add_token_merges([])
    w.add_eos_token_id(1)
    held = {}
    for name, t in hf.state_dict().items():
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        stem, kind = name.rsplit(".", 1)
        arr = t.float().numpy()
        if arr.ndim == 2:
            q = gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(f"{to_gguf[stem]}.{kind}", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            arr = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(f"{to_gguf[stem]}.{kind}", arr)
        held[name] = torch.from_numpy(np.array(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if c.tie_word_embeddings:
        held["lm_head.weight"] = held["model.embed_tokens.weight"]
    return held


@pytest.mark.parametrize("arch", ["Qwen2ForCausalLM", "Qwen3ForCausalLM"])
def test_qwen_gguf_files_run_in_their_own_precision(arch, tmp_path, monkeypatch):
    """GGUF files of Qwen2 and Qwen3 (general.architecture qwen2 / qwen3): read through the
    registry, served through the engine with their q8_0 weights, equal to transformers on the
    same (rounded) weights."""
    from tierserve import kernels

    monkeypatch.setenv("TIERSERVE_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "hf"
    folder.mkdir()
    hf = save_tiny(folder, arch, use_sliding_window=False)  # GGUF metadata has no windows
    hf.load_state_dict(write_gguf(hf, tmp_path / "tiny.gguf", arch[:5].lower()))
    ids = prompt()
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0], -1)
    want_lp = ref[torch.arange(PROMPT - 1), torch.tensor(ids[1:])].tolist()
    # float32 products: compared with transformers within 1e-4 (bf16 ones: test_quant.py)
    llm = LLM(
        model=str(tmp_path / "tiny.gguf"),
        num_kv_blocks=64,
        measure_costs=False,
        activations="float32",
        kv_cache_dtype="float32",
    )
    model = llm.executor.model
    assert type(model).__name__ == arch
    assert model.layers[0].qkv.fmt == ("q8_0" if kernels.get() is not None else "f32")
    assert (model.layers[0].qkv.bias is not None) == (arch == "Qwen2ForCausalLM")
    scored = llm.generate(ids, SamplingParams(max_tokens=0, prompt_logprobs=0))[0]
    assert [lp for lp, _ in scored.prompt_logprobs] == pytest.approx(want_lp, abs=1e-4)
    assert llm.generate(ids, GREEDY)[0].token_ids == hf_greedy(hf, ids, NEW)


def test_the_bf16_path_runs_biased_projections_within_bfloat16_rounding(tmp_path, monkeypatch):
    """Qwen2's q/k/v biases (without its sliding window, so the kernels' attention applies)
    through the ``bf16`` path, offered when reduced-precision products are allowed."""
    from tierserve import kernels
    from tierserve.model import base

    if kernels.get() is None:
        pytest.skip("kernels unavailable or TIERSERVE_KERNELS=off")
    monkeypatch.setattr(base, "amx_available", lambda: True)
    hf = save_tiny(tmp_path, "Qwen2ForCausalLM", use_sliding_window=False)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():  # transformers starts biases at zero: give them weight
        for ly in hf.model.layers:
            for proj in (ly.self_attn.q_proj, ly.self_attn.k_proj, ly.self_attn.v_proj):
                proj.bias.copy_(torch.randn(proj.bias.shape, generator=g))
    hf.save_pretrained(tmp_path, safe_serialization=True)
    ids = prompt(2) + prompt(3)[:20]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    loaded = load_model(tmp_path)
    model = registry.build_model(loaded.config, dict(loaded.weights), activations="auto")
    assert "bf16" in model.paths(16) and model.layers[0].qkv.bias is not None
    steps = [{"a": 30, "b": 9}, {"a": 27, "b": 31}, {"a": 1}, {"a": 1}, {"a": 1}]
    got = run_steps(model, steps, "bf16", {"a": ids, "b": prompt(4)})
    a_rows = torch.cat([got[:30], got[39:66], got[97:]])
    assert 1e-4 < rel_err(a_rows, ref) < 0.05
    assert (a_rows.argmax(-1) == ref.argmax(-1)).float().mean() > 0.95
