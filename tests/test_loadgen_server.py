"""`tierserve bench serve` against the real tierserve server with the embedded model, for a few
seconds, with small lengths: the default tokenizer path, usage counting and priorities."""

import json

import pytest

from tests.server_utils import running_server, small_engine_args
from tierserve.cli import main
from tierserve.engine.builder import build_engine

pytestmark = pytest.mark.model


def test_bench_serve_against_the_real_server(tmp_path):
    built = build_engine(small_engine_args(max_num_seqs=8))
    with running_server(built) as (url, _state):
        out = tmp_path / "load"
        rc = main(
            ["bench", "serve", "--base-url", url, "--concurrency", "4", "--duration", "4",
             "--warmup", "1", "--prompt-len", "32", "--output-len", "8", "--ignore-eos",
             "--mix", "25", "25", "25", "25", "--out", str(out), "--no-progress"]
        )  # fmt: skip
        assert rc == 0
        flood = tmp_path / "flood"
        rc = main(
            ["bench", "serve", "--base-url", url, "--scenario", "flood", "--flood-streams", "4",
             "--idle-probes", "2", "--probe-interval", "0.5", "--flood-settle", "1",
             "--duration", "2.5", "--prompt-len", "32", "--output-len", "4", "4", "4", "64",
             "--ignore-eos", "--priority-via", "body", "--out", str(flood), "--no-progress"]
        )  # fmt: skip
        assert rc == 0
    doc = json.loads((out / "results.json").read_text())
    run = doc["runs"][0]
    assert doc["status"] == "complete" and doc["config"]["model"] == "SmolLM2-135M-Instruct"
    assert run["completed"] > 0 and run["failed"] == 0 and run["rejected"] == 0
    assert run["throughput_total_tokens_per_s"] > run["throughput_tokens_per_s"] > 0
    rows = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    done = [r for r in rows if r["outcome"] == "completed"]
    assert {r["priority"] for r in done} == {0, 1, 2, 3}
    for r in done:  # the server's usage: 8 generated; the chat template adds to the 32
        assert r["usage_reported"] and r["output_tokens"] == 8 and r["prompt_tokens"] > 32
        assert r["arrival"] < r["chunk_times"][0] <= r["finish"]
    f = json.loads((flood / "results.json").read_text())["flood"]
    assert f["idle_probes"] == 2 and f["loaded_probes"] >= 2
    assert f["p0_ttft_ratio_p95"] > 0 and f["background_throughput_tokens_per_s"] > 0
