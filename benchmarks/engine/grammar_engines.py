"""Two grammar engines measured on the embedded model's tokenizer: llguidance and xgrammar.

For each JSON schema: the time to compile it (a fresh compiler cache each time, best of
`--repeats`), then the time to compute one token mask at each step of a walk that feeds the
tokens of a valid instance (median and p99 over the walk, all schemas pooled), and the time to
accept one token. Both engines write the same bitmask layout (int32 words, bit i of word w =
token 32 w + i), so the walk also checks that they allow the same number of tokens at each step.

xgrammar is not a dependency of tierserve: install it by hand to run this script
(`pip install --no-deps xgrammar apache-tvm-ffi`). Run:

    .venv/bin/python benchmarks/engine/grammar_engines.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from tierserve.model.loader import load_model

SCHEMAS = {
    "flat": (
        {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"],
        },
        {"name": "Ada Lovelace", "age": 36},
    ),
    "nested": (
        {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 40},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "day": {"type": "integer", "minimum": 1, "maximum": 31},
                            "high": {"type": "number"},
                            "low": {"type": "number"},
                            "sky": {"enum": ["clear", "cloudy", "rain", "snow"]},
                        },
                        "required": ["day", "high", "low", "sky"],
                        "additionalProperties": False,
                    },
                    "minItems": 1,
                    "maxItems": 7,
                },
                "source": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "url": {"type": "string"}},
                    "required": ["name"],
                },
            },
            "required": ["city", "unit", "days"],
            "additionalProperties": False,
        },
        {
            "city": "Paris",
            "unit": "celsius",
            "days": [
                {"day": 3, "high": 21.5, "low": 12, "sky": "clear"},
                {"day": 4, "high": 19, "low": 11.5, "sky": "rain"},
            ],
            "source": {"name": "Météo", "url": "https://example.org"},
        },
    ),
    "any_json": (None, {"answer": [1, 2, {"x": "y"}], "ok": True, "note": None}),
}


# Both engines are asked for compact JSON (no whitespace), which is what the walk feeds.
COMPACT = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}


class Llg:
    name = "llguidance"

    def __init__(self, tokenizer) -> None:
        import llguidance

        self.llg = llguidance
        self.tok = llguidance.LLTokenizer(tokenizer.tokenizer.to_str(), eos_token=2)

    def compile(self, schema):
        spec = {"type": "object"} if schema is None else schema
        grammar = self.llg.LLMatcher.grammar_from_json_schema(json.dumps(spec), defaults=COMPACT)
        m = self.llg.LLMatcher(self.tok, grammar)
        if m.is_error():
            raise RuntimeError(m.get_error())
        return m

    def fill(self, m, mask: torch.Tensor) -> None:
        m.unsafe_compute_mask_ptr(mask.data_ptr(), mask.numel() * 4)

    def accept(self, m, t: int) -> bool:
        return m.consume_token(t)


class Xgr:
    name = "xgrammar"

    def __init__(self, tokenizer) -> None:
        import xgrammar

        self.xgr = xgrammar
        vocab = [tokenizer.tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]
        self.info = xgrammar.TokenizerInfo(
            vocab, xgrammar.VocabType.BYTE_LEVEL, vocab_size=len(vocab), stop_token_ids=[2]
        )

    def compile(self, schema):
        compiler = self.xgr.GrammarCompiler(self.info, cache_enabled=False)
        if schema is None:
            compiled = compiler.compile_builtin_json_grammar()
        else:
            compiled = compiler.compile_json_schema(
                json.dumps(schema), any_whitespace=False, separators=(",", ":")
            )
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, m, mask: torch.Tensor) -> None:
        m.fill_next_token_bitmask(mask[None], 0)

    def accept(self, m, t: int) -> bool:
        return m.accept_token(t)


def measure(engine, tokenizer, repeats: int) -> dict:
    words = (tokenizer.vocab_size + 31) // 32
    compile_ms, mask_us, accept_us, allowed = {}, [], [], []
    for key, (schema, instance) in SCHEMAS.items():
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            m = engine.compile(schema)
            mask = torch.zeros(words, dtype=torch.int32)
            engine.fill(m, mask)  # the first mask: where a lazy engine does its work
            best = min(best, time.perf_counter() - t0)
        compile_ms[key] = 1e3 * best
        ids = tokenizer.encode(json.dumps(instance, ensure_ascii=False, separators=(",", ":")))
        m = engine.compile(schema)
        for t in [*ids, 2]:
            t0 = time.perf_counter()
            engine.fill(m, mask)
            t1 = time.perf_counter()
            if not engine.accept(m, t):
                raise RuntimeError(f"{engine.name}: {key}: token {t} refused")
            t2 = time.perf_counter()
            mask_us.append(1e6 * (t1 - t0))
            accept_us.append(1e6 * (t2 - t1))
            bits = (
                mask.view(torch.uint8)
                .unsqueeze(-1)
                .bitwise_and(torch.tensor([1 << i for i in range(8)], dtype=torch.uint8))
            )
            allowed.append(int((bits != 0).sum()))
    q = statistics.quantiles(mask_us, n=100)
    return {
        "compile_ms": compile_ms,
        "mask_us_median": statistics.median(mask_us),
        "mask_us_p99": q[98],
        "accept_us_median": statistics.median(accept_us),
        "allowed": allowed,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    tokenizer = load_model().tokenizer
    results = {}
    for cls in (Llg, Xgr):
        t0 = time.perf_counter()
        try:
            engine = cls(tokenizer)
        except ImportError as exc:
            print(f"{cls.name}: not installed ({exc})")
            continue
        setup = time.perf_counter() - t0
        results[cls.name] = r = measure(engine, tokenizer, args.repeats)
        comp = ", ".join(f"{k} {v:.1f}" for k, v in r["compile_ms"].items())
        print(
            f"{cls.name:<11} tokenizer setup {1e3 * setup:7.1f} ms | compile + first mask (ms): "
            f"{comp} | mask per token: median {r['mask_us_median']:.1f} us, "
            f"p99 {r['mask_us_p99']:.1f} us | accept: median {r['accept_us_median']:.1f} us"
        )
    if len(results) == 2:
        a, b = (results[k]["allowed"] for k in ("llguidance", "xgrammar"))
        same = sum(x == y for x, y in zip(a, b, strict=True))
        print(f"steps where both allow the same number of tokens: {same} of {len(a)}")


if __name__ == "__main__":
    main()
