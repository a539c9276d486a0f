"""Speculative decoding through the HTTP server (the fake stack: real scheduler, engine thread,
API and metrics over the KV-simulating executor): usage reports accepted and rejected draft
tokens, the per-request opt-out holds, and the spec-decode series count what was verified."""

from __future__ import annotations

import json
import random
import re

import httpx

from tests.fake_engine import fake_built, words
from tests.server_utils import running_server
from tests.test_spec_core import MEMORY_BOUND, FixedTime, oracle
from tierserve.core.speculation import SpecConfig, Speculation


def _metric(text: str, name: str) -> float:
    vals = [float(m) for m in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)]
    return sum(vals)


def test_usage_and_metrics_count_drafts_and_the_opt_out_holds():
    built = fake_built(step_s=0.0)
    sched = built.engine.scheduler
    sched.step_time = FixedTime(MEMORY_BOUND)
    sched.speculation = Speculation(SpecConfig(prior_acceptance=0.9), oracle(random.Random(3), 0.3))
    with running_server(built) as (url, _state):
        body = {"prompt": words(12), "max_tokens": 40, "priority": 0, "ignore_eos": True}
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        details = usage["completion_tokens_details"]
        assert usage["completion_tokens"] == 40
        assert (
            details["accepted_prediction_tokens"] > 0 and details["rejected_prediction_tokens"] > 0
        )
        drafted = details["accepted_prediction_tokens"] + details["rejected_prediction_tokens"]

        opt_out = httpx.post(
            f"{url}/v1/completions", json=body | {"speculative": False}, timeout=30
        ).json()
        assert "completion_tokens_details" not in opt_out["usage"]

        stream = body | {"stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", f"{url}/v1/completions", json=stream, timeout=30) as s:
            events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
        last = json.loads(events[-2])  # the usage chunk, before [DONE]
        assert last["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0
        streamed = sum(last["usage"]["completion_tokens_details"].values())

        text = httpx.get(f"{url}/metrics", timeout=10).text
    assert _metric(text, "vllm:spec_decode_num_draft_tokens_total") == drafted + streamed
    assert _metric(text, "llm_spec_draft_tokens_total") == drafted + streamed
    accepted = _metric(text, "vllm:spec_decode_num_accepted_tokens_total")
    assert 0 < accepted < drafted + streamed
    assert 0 < _metric(text, "llm_spec_acceptance_rate") < 1


def _served(speculate: bool, body: dict) -> dict:
    built = fake_built(step_s=0.0)
    sched = built.engine.scheduler
    sched.step_time = FixedTime(MEMORY_BOUND)
    if speculate:
        cfg = SpecConfig(prior_acceptance=0.9)
        sched.speculation = Speculation(cfg, oracle(random.Random(5), 0.0))  # always right
    with running_server(built) as (url, _state):
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_stop_string_inside_accepted_drafts_ends_the_output_where_plain_decoding_does():
    body = {"prompt": words(12), "max_tokens": 40, "priority": 0, "ignore_eos": True}
    plain = _served(False, body)["choices"][0]["text"].split()
    stop = plain[9]  # the 10th output word: inside a run of accepted drafts with speculation
    body |= {"stop": [stop]}
    want, got = _served(False, body), _served(True, body)
    assert got["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0
    assert got["choices"][0]["text"] == want["choices"][0]["text"]
    assert got["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"] == "stop"
    assert got["usage"]["completion_tokens"] == want["usage"]["completion_tokens"]


def test_a_tenant_that_opted_out_never_speculates(tmp_path):
    from tierserve.api.settings import ServerSettings

    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(
        "tenants:\n"
        "  fast: {keys: [sk-fast], max_tier: realtime}\n"
        "  plain: {keys: [sk-plain], max_tier: realtime, speculative: false}\n"
    )
    built = fake_built(step_s=0.0)
    sched = built.engine.scheduler
    sched.step_time = FixedTime(MEMORY_BOUND)
    sched.speculation = Speculation(SpecConfig(prior_acceptance=0.9), oracle(random.Random(1), 0.0))
    body = {"prompt": words(12), "max_tokens": 30, "priority": 0, "ignore_eos": True}
    with running_server(built, ServerSettings(tenants_file=str(tenants))) as (url, _):

        def usage(key):
            h = {"authorization": f"Bearer {key}"}
            r = httpx.post(f"{url}/v1/completions", json=body, headers=h, timeout=30)
            assert r.status_code == 200, r.text
            return r.json()["usage"]

        assert usage("sk-fast")["completion_tokens_details"]["accepted_prediction_tokens"] > 0
        assert "completion_tokens_details" not in usage("sk-plain")
