"""The output-length predictor in the served engine: `--predictive` sets the scheduler's uses,
what the predictor learned is saved when the engine thread stops and restored at the next start
(through the real engine thread and HTTP server), and its error is a metric."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.fake_engine import fake_built, words
from tests.server_utils import running_server
from tierserve.cli.serve import build_configs, merged_options
from tierserve.engine.args import EngineArgs, parse_predictive
from tierserve.engine.builder import predictor
from tierserve.request import Request
from tierserve.sampling_params import SamplingParams


def test_learned_lengths_survive_a_restart_and_the_error_is_exported(tmp_path, monkeypatch):
    monkeypatch.setenv("TIERSERVE_CACHE_DIR", str(tmp_path))
    body = {"prompt": words(12), "max_tokens": 9, "ignore_eos": True, "priority": 1}
    with running_server(fake_built(step_s=0.0)) as (url, _state):
        for _ in range(12):
            assert httpx.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 200
        text = httpx.get(f"{url}/metrics", timeout=10).text
    count = re.search(
        r'^llm_output_length_prediction_error_tokens_count\{[^}]*priority="P1"[^}]*\} (\S+)$',
        text,
        re.M,
    )
    assert count and float(count.group(1)) == 12
    assert (tmp_path / "predictor" / "lengths.json").exists()  # saved as the engine stopped
    fresh = predictor(EngineArgs())  # the next start
    req = Request("x", list(range(1, 13)), SamplingParams(max_tokens=9, ignore_eos=True))
    assert fresh.predict(req, 0.0).level != "none"  # it knows this kind of request
    cold = predictor(EngineArgs(predictor_state=False))
    assert cold.predict(req, 0.0).level == "none"


def test_a_corrupt_state_file_starts_cold_with_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TIERSERVE_CACHE_DIR", str(tmp_path))
    (tmp_path / "predictor").mkdir()
    (tmp_path / "predictor" / "lengths.json").write_text("{not json")
    p = predictor(EngineArgs())
    assert len(p) == 0 and "corrupt" in caplog.text


def test_the_predictive_flag():
    assert parse_predictive(["off"]) == () and parse_predictive(["all"]) == (
        "order",
        "reserve",
        "ttft",
        "routing",
    )
    from tierserve.cli import build_parser

    ns = build_parser().parse_args(["serve", "--predictive", "order", "ttft"])
    engine, _server = build_configs(merged_options(ns))
    assert engine.predictive == ("order", "ttft")
    ns = build_parser().parse_args(["serve", "--predictive", "routing"])
    engine, _server = build_configs(merged_options(ns))
    assert engine.predictive == ("routing",)
    with pytest.raises(ValueError, match="predictive uses"):
        EngineArgs(predictive=("bogus",))
