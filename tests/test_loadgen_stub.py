"""`tierserve bench serve` end to end against a stub OpenAI-compatible server on a loopback
port: real HTTP and wall-clock time, so time bounds are one-sided (a chunk cannot arrive before
the stub sends it) and the rest is checked exactly against the recorded requests."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.loadgen_stub import StubConfig, serving, word_tokenizer_file
from tests.server_utils import free_port
from tierserve.cli import main
from tierserve.loadgen.client import RequestRecord
from tierserve.loadgen.metrics import itls, run_stats, ttft
from tierserve.loadgen.workload import Gaps

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return word_tokenizer_file(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def bench(url, out, tok, *extra) -> int:
    return main(
        ["bench", "serve", "--base-url", url, "--tokenizer", tok, "--out", str(out),
         "--lengths", "cpu", "--no-progress", *extra]
    )  # fmt: skip


def load(out):
    doc = json.loads((out / "results.json").read_text())
    rows = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    recs = {}
    for row in rows:
        run = row.pop("run")
        recs.setdefault(run, []).append(RequestRecord(**row))
    return doc, recs


def test_closed_loop_sweep_records_and_reports(tmp_path, tok):
    cfg = StubConfig(ttft_s=(0.05, 0.3, 0.3, 0.3), gap_s=0.02, usage_factor=2, refuse={2: (429, 1)})
    out = tmp_path / "run"
    with serving(cfg) as url:
        rc = bench(url, out, tok, "--concurrency", "2", "4", "--duration", "2", "--warmup",
                   "0.5", "--output-len", "4", "--ttft-sla", "2", "0.2", "60", "none")  # fmt: skip
    assert rc == 0
    doc, recs = load(out)
    assert doc["status"] == "complete" and doc["config"]["model"] == "stub-model"
    assert [r["concurrency"] for r in doc["runs"]] == [2, 4]
    for i, run in enumerate(doc["runs"]):
        records = recs[i]
        # The figures are exactly what the recorded requests give.
        window = tuple(run["window_s"])
        assert window == (0.5, 2.0)
        stats = run_stats(records, window, (2.0, 0.2, 60.0, None))
        assert {k: run[k] for k in stats} == json.loads(json.dumps(stats))
        done = [r for r in records if r.outcome == "completed"]
        assert done and all(r.status == 200 for r in done)
        for r in done:  # one-sided bounds: the stub sleeps before it sends
            assert ttft(r) >= cfg.ttft_s[r.priority] and len(r.chunk_times) == 4
            assert r.finish - r.arrival >= cfg.ttft_s[r.priority] + 3 * cfg.gap_s
            assert r.output_tokens == 8 and r.prompt_tokens == 11  # from usage
            assert len(itls(r)) == 3
        refused = [r for r in records if r.priority == 2]
        assert all(r.outcome == "rejected" and r.retry_after == 1.0 for r in refused)
        measured_p2 = [r for r in refused if r.measured]
        assert run["classes"]["P2"]["refusals_by_status"] == (
            {"429": len(measured_p2)} if measured_p2 else {}
        )
        p1 = run["classes"]["P1"]
        assert p1["requests"] > 0 and p1["sla_attainment"] == 0.0  # TTFT >= 0.3 > 0.2
        assert p1["goodput_requests_per_s"] == 0.0
        assert all(r.arrival < 2.0 for r in records)
    headers = [h for h, _ in cfg.seen]
    assert {h["x-request-tier"] for h in headers} <= {"p0", "p1", "p2", "p3"}
    report = (out / "report.md").read_text()
    assert "closed loop, concurrency 4" in report and "429: " in report
    for png in ("ttft_cdf.png", "ttft_p95.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"


def test_open_loop_priority_in_body_and_keys(tmp_path, tok):
    cfg = StubConfig(ttft_s=(0.01,) * 4)
    out = tmp_path / "open"
    with serving(cfg) as url:
        rc = bench(url, out, tok, "--request-rate", "20", "--duration", "1.5", "--warmup", "0",
                   "--priority-via", "body", "--api-key", "p0=k0", "--api-key", "kall",
                   "--output-len", "2", "--seed", "4")  # fmt: skip
    assert rc == 0
    doc, recs = load(out)
    assert doc["runs"][0]["request_rate"] == 20 and doc["config"]["arrival"] == "poisson"
    records = recs[0]
    gaps, t = Gaps("poisson", 20.0, 2.0, seed=4), 0.0
    due = []
    while (t := t + gaps.next()) < 1.5:
        due.append(t)
    assert len(records) == len(due)  # one request per scheduled arrival, none dropped
    for r, d in zip(records, due, strict=True):
        assert r.arrival >= d - 1e-6  # never sent before its time
    for headers, body in cfg.seen:
        assert "x-request-tier" not in headers and body["priority"] in (0, 1, 2, 3)
        want = "Bearer k0" if body["priority"] == 0 else "Bearer kall"
        assert headers["authorization"] == want


@pytest.mark.parametrize(
    "mode,needle,kind",
    [("404", "HTTP 404", "404"), ("500", "HTTP 500: boom", "500"),
     ("malformed", "malformed stream", "malformed"), ("truncated", "truncated stream", "truncated"),
     ("cut", "stream broken", "stream_broken"), ("error_event", "error event", "error_event")],
)  # fmt: skip
def test_failing_server_stops_with_a_message_and_partial_results(
    tmp_path, tok, capsys, mode, needle, kind
):
    out = tmp_path / mode
    with serving(StubConfig(mode=mode)) as url:
        rc = bench(url, out, tok, "--concurrency", "2", "--duration", "20", "--warmup", "0",
                   "--max-consecutive-errors", "3", "--output-len", "6")  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert "requests failed in a row" in err and needle in err and str(out) in err
    doc, recs = load(out)
    assert doc["status"] == "aborted" and needle in doc["message"]
    errors = doc["runs"][0]["overall"]["errors"]
    assert errors.get(kind, 0) >= 3 and len(recs[0]) >= 3
    if mode in ("truncated", "error_event"):  # what arrived before the break is kept
        assert all(len(r.chunk_times) == 4 for r in recs[0] if r.outcome == "failed")


def test_unreachable_url_is_a_clear_message(tmp_path, tok, capsys):
    out = tmp_path / "none"
    rc = bench(f"http://127.0.0.1:{free_port()}", out, tok, "--duration", "5")
    err = capsys.readouterr().err
    assert rc == 1 and "cannot reach http://127.0.0.1:" in err and "Traceback" not in err
    doc = json.loads((out / "results.json").read_text())
    assert doc["status"] == "aborted" and doc["runs"] == []


def test_bad_arguments_exit_2_naming_the_option(tmp_path, tok, capsys):
    cases = [
        (["--concurrency", "0"], "--concurrency must be at least 1"),
        (["--concurrency", "2", "--request-rate", "1"], "not both"),
        (["--duration", "5", "--warmup", "6"], "--warmup 6.0 must lie in [0, --duration)"),
        (["--dataset", "sharegpt-like"], "--dataset takes 'random' or 'sharegpt-like FILE'"),
        (["--api-key", "gold=k"], "--api-key gold=...: invalid tier 'gold'"),
        (["--tpot-slo", "1", "2"], "--tpot-slo takes one value or four"),
    ]
    for extra, needle in cases:
        assert bench("http://127.0.0.1:9", tmp_path / "x", tok, *extra) == 2
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err, err
    assert main(["bench", "serve", "--out", str(tmp_path)]) == 2
    assert "--base-url is required" in capsys.readouterr().err


def test_ctrl_c_midway_writes_partial_results(tmp_path, tok):
    cfg = StubConfig(ttft_s=(0.1,) * 4, gap_s=0.1)
    out = tmp_path / "int"
    with serving(cfg) as url:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tierserve", "bench", "serve", "--base-url", url,
             "--tokenizer", tok, "--out", str(out), "--lengths", "cpu", "--output-len", "200",
             "--concurrency", "3", "--duration", "60", "--warmup", "0", "--no-progress"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        )  # fmt: skip
        deadline = time.time() + 60
        while len(cfg.seen) < 3 and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # chunks are flowing
        proc.send_signal(signal.SIGINT)
        _stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "interrupted by Ctrl-C" in stderr
    assert "partial results written" in stderr
    doc, recs = load(out)
    assert doc["status"] == "interrupted" and len(doc["runs"]) == 1
    cut = [r for r in recs[0] if r.outcome == "unfinished"]
    assert len(cut) == 3 and all(r.chunk_times and r.finish for r in cut)
    assert doc["runs"][0]["overall"]["unfinished"] == 3
    assert (out / "report.md").read_text().count("INTERRUPTED") == 1


def test_flood_scenario_on_a_stub(tmp_path, tok):
    cfg = StubConfig(ttft_s=(0.02, 0.02, 0.02, 0.05), gap_s=0.01)
    out = tmp_path / "flood"
    with serving(cfg) as url:
        rc = bench(url, out, tok, "--scenario", "flood", "--flood-streams", "3", "--idle-probes",
                   "2", "--probe-interval", "0.3", "--flood-settle", "0.3", "--duration", "1.2",
                   "--output-len", "4", "4", "4", "30")  # fmt: skip
    assert rc == 0
    doc, recs = load(out)
    f = doc["flood"]
    assert [r["phase"] for r in doc["runs"]] == ["idle", "flood"]
    assert f["idle_probes"] == 2 and f["loaded_probes"] == 3  # at 0.3, 0.6, 0.9 s
    idle = sorted(ttft(r) for r in recs[0] if r.priority == 0)
    loaded = sorted(ttft(r) for r in recs[1] if r.priority == 0)
    assert all(r.priority in (0, 3) for r in recs[1]) and len(idle) == 2
    assert f["p0_idle_ttft_p95_s"] == idle[-1] and f["p0_loaded_ttft_p95_s"] == loaded[-1]
    assert f["p0_ttft_ratio_p95"] == loaded[-1] / idle[-1]
    assert f["background_throughput_tokens_per_s"] > 0
    assert (
        f["background_throughput_tokens_per_s"]
        == (doc["runs"][1]["classes"]["P3"]["throughput_tokens_per_s"])
    )
    tiers = [h["x-request-tier"] for h, _ in cfg.seen]
    assert tiers.count("p0") == 5 and set(tiers) == {"p0", "p3"}


def test_compare_renders_runs_and_a_simulator_prediction_side_by_side(tmp_path, tok):
    with serving(StubConfig(ttft_s=(0.01,) * 4)) as url:
        for label in ("fcfs", "hybrid"):
            rc = bench(url, tmp_path / label, tok, "--concurrency", "2", "--num-requests",
                       "6", "--label", label, "--output-len", "2")  # fmt: skip
            assert rc == 0
    sim = tmp_path / "sim"
    sim.mkdir()
    cls = {"ttft_p95_s": 0.125, "sla_attainment": 1.0}
    sim_run = {"policy": "hybrid", "concurrency": 2, "rate": None, "hardware": "cpu-local",
               "classes": {c: cls for c in ("P0", "P1", "P2", "P3")},
               "throughput_tokens_per_s": 50.0, "throughput_total_tokens_per_s": 400.0}  # fmt: skip
    (sim / "results.json").write_text(json.dumps([sim_run]))
    dirs = [str(tmp_path / "fcfs"), str(tmp_path / "hybrid"), str(sim)]
    assert main(["bench", "serve", "--compare", *dirs, "--out", str(tmp_path / "cmp")]) == 0
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| load | fcfs | hybrid | sim hybrid (cpu-local) |" in md
    fcfs = json.loads((tmp_path / "fcfs" / "results.json").read_text())["runs"][0]
    total = fcfs["throughput_total_tokens_per_s"]
    assert f"{total:.1f} (100.0%)" in md and "0.125 s" in md
    assert (tmp_path / "cmp" / "compare_ttft_p95.png").exists()
    assert main(["bench", "serve", "--compare", str(tmp_path / "nope"), "--out", "x"]) == 2
