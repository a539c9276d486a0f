"""`bench serve --workload heavy-tail`: the simulator's heavy-tailed mix as real requests. The
sequence is reproducible, lengths spread by template as the simulator draws them, each request is
sent by its tenant and told to end at its drawn length by EOS through settings the length
predictor does not read; against the real server it ends there and the predictor learns."""

from __future__ import annotations

import json
import re
import statistics

import httpx
import pytest

from tests.loadgen_stub import StubConfig, serving, word_tokenizer_file
from tierserve.cli import main
from tierserve.core.predict.features import Features
from tierserve.loadgen.client import Endpoint, build_request
from tierserve.loadgen.heavy_tail import HeavyTailSource
from tierserve.loadgen.text import PromptMaker, load_tokenizer
from tierserve.priority import Priority
from tierserve.request import Request
from tierserve.sampling_params import SamplingParams
from tierserve.workloads.heavy_tail import TEMPLATES, HeavyTailWorkload
from tierserve.workloads.synthetic import WorkloadConfig


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return word_tokenizer_file(tmp_path_factory.mktemp("tk") / "tokenizer.json")


@pytest.fixture(scope="module")
def prompts(tok):
    return PromptMaker(load_tokenizer(tok))


def test_the_sequence_is_the_simulators_draws_and_reproducible(prompts):
    cfg = WorkloadConfig(seed=5)
    ours, sim = HeavyTailSource(cfg, prompts, 1.0), HeavyTailWorkload(cfg)
    specs = [ours.next() for _ in range(300)]
    for s in specs:  # the simulator's requests, one for one
        r = sim.make(0.0)
        assert (s.priority, s.tenant, s.max_tokens) == (
            r.priority,
            r.tenant,
            r.sampling_params.max_tokens,
        )
        assert s.prompt_tokens == len(r.prompt_token_ids)
        assert s.stop_after == max(2, sim.output_lengths[r.request_id])
        assert (
            prompts.count(s.messages[0]["content"]) + prompts.count(s.messages[1]["content"])
            == s.prompt_tokens
        )
    again = HeavyTailSource(cfg, prompts, 1.0)
    assert [again.next() for _ in range(300)] == specs
    other_level = HeavyTailSource(cfg, prompts, 1.0, text_seed="5:1")
    for s, o in zip(specs, (other_level.next() for _ in specs), strict=True):
        assert (s.template, s.prompt_tokens, s.stop_after) == (
            o.template,
            o.prompt_tokens,
            o.stop_after,
        )
        assert s.messages[0] == o.messages[0] and s.messages[1] != o.messages[1]
    systems = {s.template: s.messages[0]["content"] for s in specs}
    assert len(set(systems.values())) == len(systems) == len(TEMPLATES)
    for s in specs:  # one system prompt per template, at its head
        assert s.messages[0]["content"] == systems[s.template]
        assert s.prompt.startswith(systems[s.template])


@pytest.mark.parametrize("scale", [1.0, 0.1])
def test_output_lengths_spread_by_template(prompts, scale):
    src = HeavyTailSource(WorkloadConfig(seed=2), prompts, scale)
    by: dict[str, list[int]] = {}
    for _ in range(4000):
        s = src.next()
        assert 2 <= s.stop_after <= s.max_tokens
        by.setdefault(s.template, []).append(s.stop_after)
    spread = {k: statistics.quantiles(v, n=10)[-1] / statistics.median(v) for k, v in by.items()}
    median = {k: statistics.median(v) for k, v in by.items()}
    assert spread["faq"] < 1.5 and spread["summary"] < 1.5 and spread["report"] < 1.5
    assert spread["agent"] > 8 and spread["chat"] > 3
    want = {t.name: t.output.median * scale for t in TEMPLATES}
    for name in ("summary", "report", "chat", "eval"):  # medians as drawn, after scaling
        assert abs(median[name] - want[name]) <= 0.15 * want[name] + 1
    tenants = {s.template: (s.tenant, s.priority) for s in (src.next() for _ in range(500))}
    assert tenants["agent"] == ("tenant-2", Priority.P1)
    assert tenants["classify"] == ("tenant-1", Priority.P2)


def test_a_request_ends_by_eos_and_the_predictor_cannot_see_where(prompts):
    src = HeavyTailSource(WorkloadConfig(seed=1), prompts, 0.1)
    spec = next(s for s in iter(src.next, None) if s.template == "chat")
    ep = Endpoint(
        "http://s", eos_token_id=7, tenant_keys={"tenant-3": "k3"}, api_keys={None: "all"}
    )
    headers, body = build_request(ep, spec)
    assert body["max_tokens"] == spec.max_tokens == 410  # generous: 4096 x 0.1
    assert body["min_tokens"] == spec.stop_after - 1 and body["logit_bias"] == {"7": 100}
    assert headers["authorization"] == "Bearer k3" and "x-tenant-id" not in headers
    assert body["messages"] == list(spec.messages)
    headers, _ = build_request(Endpoint("http://s", eos_token_id=7), spec)
    assert headers["x-tenant-id"] == "tenant-3" and "authorization" not in headers
    with pytest.raises(ValueError, match="EOS token id"):
        build_request(Endpoint("http://s"), spec)

    def features(min_tokens: int) -> tuple:
        sp = SamplingParams(max_tokens=410, min_tokens=min_tokens, logit_bias={7: 100})
        req = Request("r", list(range(100)), sp, priority=1, tenant="tenant-3")
        return Features.of(req).key_chain()

    assert features(3) == features(300)  # the drawn length is no feature


def test_bad_combinations_are_named(tmp_path, tok, capsys):
    base = ["bench", "serve", "--base-url", "http://127.0.0.1:9", "--tokenizer", tok,
            "--out", str(tmp_path), "--workload", "heavy-tail", "--no-progress"]  # fmt: skip
    assert main([*base, "--output-len", "8", "--ignore-eos"]) == 2
    assert "drop --output-len, --ignore-eos" in capsys.readouterr().err
    assert main(base) == 2  # a bare tokenizer.json names no EOS
    assert "--eos-token-id" in capsys.readouterr().err
    assert main([*base, "--tenant-key", "nokey"]) == 2
    assert "TENANT=KEY" in capsys.readouterr().err


def test_heavy_tail_on_a_stub_records_templates_and_tenants(tmp_path, tok):
    cfg = StubConfig(ttft_s=(0.0,) * 4)
    out = tmp_path / "ht"
    with serving(cfg) as url:
        rc = main(
            ["bench", "serve", "--base-url", url, "--tokenizer", tok, "--out", str(out),
             "--lengths", "cpu", "--workload", "heavy-tail", "--eos-token-id", "3",
             "--tenant-key", "tenant-1=k1", "--concurrency", "4", "--num-requests", "40",
             "--no-progress"]
        )  # fmt: skip
    assert rc == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["config"]["workload"] == "heavy-tail" and doc["config"]["eos_token_id"] == 3
    assert doc["config"]["templates"]["report"]["max_tokens"] == 410
    rows = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    assert {r["template"] for r in rows} >= {"faq", "agent", "classify"}
    for headers, body in cfg.seen:
        if "assistant of tenant-1. " in body["messages"][0]["content"]:
            assert headers["authorization"] == "Bearer k1"
        else:
            assert re.fullmatch(r"tenant-[023]", headers["x-tenant-id"])
        assert body["logit_bias"] == {"3": 100} and body["min_tokens"] < body["max_tokens"]


@pytest.mark.model
def test_against_the_real_server_requests_end_at_their_drawn_length(tmp_path):
    from tests.server_utils import running_server, small_engine_args
    from tierserve.engine.builder import build_engine

    built = build_engine(small_engine_args(max_num_seqs=8))
    out = tmp_path / "ht"
    with running_server(built) as (url, _state):
        rc = main(
            ["bench", "serve", "--base-url", url, "--workload", "heavy-tail", "--lengths", "cpu",
             "--length-scale", "0.3", "--concurrency", "4", "--num-requests", "16",
             "--mix", "25", "25", "25", "25", "--out", str(out), "--no-progress"]
        )  # fmt: skip
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
    assert rc == 0
    rows = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    done = [r for r in rows if r["outcome"] == "completed"]
    assert len(done) >= 16
    for r in done:  # the server's usage: exactly the drawn length, EOS included
        assert r["usage_reported"] and r["output_tokens"] == r["stop_after"]
    counts = re.findall(
        r"^llm_output_length_prediction_error_tokens_count\{[^}]*\} (\S+)$", metrics, re.M
    )
    assert sum(float(c) for c in counts) >= len(done)  # every one taught the predictor
