"""`bench serve` fits the run to the server (issue 23, item 12): `--lengths auto` (the default)
picks the CPU lengths for a slow server from one timed request, any run with too few measured
requests per class is warned about (console and report), and an empty plot panel says
"no data"."""

from __future__ import annotations

import json

import pytest

from tests.loadgen_stub import StubConfig, serving, word_tokenizer_file
from tierserve.cli import main
from tierserve.loadgen import plots


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return word_tokenizer_file(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def test_the_choice_follows_the_measured_speed():
    from tierserve.loadgen.sizing import Speed, choose_lengths

    slow = Speed(ttft_s=0.15, decode_tok_s=20.0)  # a 2-core CPU with a small model
    preset, why = choose_lengths(slow, window_s=50.0)
    assert preset == "cpu" and "too long for a 50 s window" in why
    fast = Speed(ttft_s=0.02, decode_tok_s=400.0)
    assert choose_lengths(fast, window_s=50.0)[0] == "sim"
    assert choose_lengths(None, window_s=50.0)[0] == "sim"  # no measurement: no change


def _bench(url, out, tok, *extra) -> int:
    return main(
        ["bench", "serve", "--base-url", url, "--tokenizer", tok, "--out", str(out),
         "--no-progress", *extra]
    )  # fmt: skip


def test_auto_lengths_pick_cpu_for_a_slow_server_and_few_samples_are_warned(tmp_path, tok, capsys):
    cfg = StubConfig(ttft_s=(0.1,) * 4, gap_s=0.03)  # ~33 tokens/s
    out = tmp_path / "run"
    with serving(cfg) as url:
        rc = _bench(url, out, tok, "--concurrency", "1", "--duration", "3", "--warmup", "0.5")
    assert rc == 0
    err = capsys.readouterr().err
    assert "lengths cpu:" in err and "too long for a 2.5 s window" in err
    doc = json.loads((out / "results.json").read_text())
    assert doc["config"]["lengths"] == "auto: cpu" and doc["config"]["lengths_reason"]
    # The CPU lengths were sent (sim's outputs start at 8..64 tokens and reach 512..2048).
    sent = [json.loads(line)["max_tokens"] for line in (out / "requests.jsonl").open()]
    assert sent and max(sent) <= 256
    (run,) = doc["runs"]
    assert run["warnings"] and all("too few for its percentiles" in w for w in run["warnings"])
    assert "warning: concurrency 1: P0 has" in err
    assert "**Warning:**" in (out / "report.md").read_text()


def test_auto_lengths_keep_the_simulators_for_a_fast_server(tmp_path, tok, capsys):
    out = tmp_path / "run"
    with serving(StubConfig()) as url:
        rc = _bench(url, out, tok, "--concurrency", "1", "--num-requests", "2")
    assert rc == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["config"]["lengths"] == "auto: sim"
    assert "lengths sim:" in capsys.readouterr().err


def test_empty_panels_say_no_data(tmp_path, monkeypatch):
    marked = []
    real = plots._no_data
    monkeypatch.setattr(plots, "_no_data", lambda ax: marked.append(ax) or real(ax))
    ttfts = [{"P0": [], "P1": [0.1, 0.2], "P2": [], "P3": []}, {c: [] for c in plots.CLASSES}]
    plots.ttft_cdf(["has P1", "nothing"], ttfts, tmp_path / "cdf.png")
    assert len(marked) == 1  # the run with nothing measured
    empty = {"ttft_p95_s": None}
    run = {"concurrency": 1, "classes": {c: dict(empty) for c in plots.CLASSES}}
    run["classes"]["P1"] = {"ttft_p95_s": 0.5}
    marked.clear()
    plots.ttft_p95_vs_load({"x": [run]}, tmp_path / "p95.png")
    assert len(marked) == 3  # P0, P2, P3
