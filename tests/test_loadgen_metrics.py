"""The load generator's arithmetic, exactly: figures computed from recorded times by pure
functions (no server, no clock). Times are binary fractions, so equality is exact."""

import pytest

from tierserve.loadgen.client import RequestRecord
from tierserve.loadgen.metrics import (
    e2e,
    itls,
    meets_slos,
    run_stats,
    tokens_in_window,
    tpot,
    ttft,
)


def rec(prio, arrival, chunks=(), finish=None, out=None, outcome="completed", **kw):
    r = RequestRecord(
        index=kw.pop("index", 0),
        priority=prio,
        arrival=arrival,
        prompt_tokens=kw.pop("prompt", 8),
        max_tokens=16,
        measured=kw.pop("measured", True),
        outcome=outcome,
        status=kw.pop("status", 200),
        chunk_times=list(chunks),
        finish=finish if finish is not None else (chunks[-1] if chunks else arrival),
        **kw,
    )
    r.output_tokens = len(chunks) if out is None else out
    r.usage_reported = out is not None
    return r


def test_per_request_latencies_from_chunk_arrival_times():
    r = rec(0, 1.0, [1.5, 1.75, 2.25, 2.5], finish=2.75, out=6)
    assert ttft(r) == 0.5
    assert itls(r) == [0.25, 0.5, 0.25]
    assert tpot(r) == (2.75 - 1.5) / 5 == 0.25  # usage counts 6 tokens over 4 chunks
    assert e2e(r) == 1.75
    # Tokens are spread evenly over chunks (1.5 each); the prompt counts at the first chunk.
    assert tokens_in_window(r, 1.75, 2.5) == (4.5, 4.5)
    assert tokens_in_window(r, 0.0, 1.5) == (1.5, 9.5)
    # One token: no TPOT, no gaps; a request that did not complete has no E2E or TPOT.
    one = rec(1, 0.0, [0.25])
    assert tpot(one) is None and itls(one) == [] and e2e(one) == 0.25
    cut = rec(1, 0.0, [0.25, 0.5], outcome="unfinished")
    assert tpot(cut) is None and e2e(cut) is None and itls(cut) == [0.25]


def test_slo_checks_ttft_and_tpot():
    r = rec(0, 0.0, [0.5, 1.0, 1.5])  # TTFT 0.5, TPOT 0.5
    assert meets_slos(r, 0.5, None) and meets_slos(r, None, 0.5)
    assert not meets_slos(r, 0.25, None) and not meets_slos(r, 0.5, 0.25)
    assert not meets_slos(rec(0, 0.0, [0.5], outcome="failed"), None, None)


def test_percentiles_are_nearest_rank_per_class():
    records = [rec(1, 0.0, [i / 4], index=i) for i in range(1, 21)]  # TTFTs 0.25 .. 5.0
    s = run_stats(records, (0.0, 10.0), (None,) * 4)["classes"]["P1"]
    assert (s["ttft_p50_s"], s["ttft_p95_s"], s["ttft_p99_s"]) == (10 / 4, 19 / 4, 20 / 4)
    assert s["ttft_mean_s"] == sum(i / 4 for i in range(1, 21)) / 20


@pytest.fixture
def mixed_run():
    """Window [10, 20] s; SLAs 0.5 / 2 / 60 / none; TPOT SLO 0.25 s for P1 only."""
    return [
        rec(1, 9.0, [9.5, 10.0, 10.5, 11.0], measured=False),  # warm-up: only its tokens count
        rec(0, 10.0, [10.25, 10.5, 10.75], prompt=16),  # a: good
        rec(1, 11.0, [12.0, 12.5, 13.0, 13.5, 14.0], out=10, prompt=32),  # b: good, TPOT 2/9
        rec(1, 12.0, [13.0, 14.0, 15.0]),  # c: meets the TTFT SLA, misses TPOT (1.0)
        rec(1, 12.5, outcome="rejected", status=429, retry_after=2.0),  # d
        rec(2, 13.0, outcome="rejected", status=503, retry_after=4.0),  # e
        rec(2, 13.0, outcome="failed", status=500, error="HTTP 500: boom"),  # f
        rec(2, 14.0, [18.0, 19.0, 21.0], prompt=4),  # g: 2 of its 3 chunks in the window
        rec(3, 15.0, [16.0, 17.0], finish=19.5, outcome="unfinished"),  # h
        rec(3, 16.0, [16.5, 17.0], outcome="failed", error="truncated stream: ..."),  # i
        rec(0, 17.0, [17.75], prompt=4),  # j: TTFT 0.75 misses P0's SLA
    ]


def test_sla_attainment_goodput_throughput_and_refusals_per_class(mixed_run):
    res = run_stats(mixed_run, (10.0, 20.0), (0.5, 2.0, 60.0, None), (None, 0.25, None, None))
    p0, p1, p2, p3 = (res["classes"][c] for c in ("P0", "P1", "P2", "P3"))
    assert (p0["requests"], p0["completed"]) == (2, 2)
    assert (p0["ttft_p50_s"], p0["ttft_p95_s"], p0["ttft_mean_s"]) == (0.25, 0.75, 0.5)
    assert (p0["itl_p50_s"], p0["tpot_p50_s"], p0["e2e_p95_s"]) == (0.25, 0.25, 0.75)
    assert p0["sla_attainment"] == 0.5 and p0["goodput_requests_per_s"] == 1 / 10
    assert p0["throughput_tokens_per_s"] == 4 / 10
    assert p0["throughput_total_tokens_per_s"] == (3 + 16 + 1 + 4) / 10

    # P1: the warm-up request is not measured, but its 3 tokens inside the window count.
    assert (p1["requests"], p1["completed"], p1["rejected"]) == (3, 2, 1)
    assert p1["sla_attainment"] == 2 / 3  # b, c met; the refusal d is a miss
    assert p1["goodput_requests_per_s"] == 1 / 10  # c misses the TPOT SLO
    assert p1["tpot_p95_s"] == 1.0 and p1["tpot_p50_s"] == (14.0 - 12.0) / 9
    assert p1["throughput_tokens_per_s"] == (3 + 10 + 3) / 10
    assert p1["throughput_total_tokens_per_s"] == (3 + 42 + 11) / 10
    assert p1["refusals_by_status"] == {"429": 1} and p1["retry_after_max_s"] == 2.0
    assert p1["input_tokens"] == 32 + 8 and p1["output_tokens"] == 10 + 3

    assert (p2["requests"], p2["completed"], p2["rejected"], p2["failed"]) == (3, 1, 1, 1)
    assert p2["sla_attainment"] == 1 / 3 and p2["goodput_requests_per_s"] == 1 / 10
    assert p2["throughput_tokens_per_s"] == 2 / 10 and p2["throughput_total_tokens_per_s"] == 6 / 10
    assert p2["refusals_by_status"] == {"503": 1} and p2["errors"] == {"500": 1}

    # P3: the unfinished request is not counted for the SLA; the failed one had a first token.
    assert (p3["requests"], p3["completed"], p3["failed"], p3["unfinished"]) == (2, 0, 1, 1)
    assert p3["sla_attainment"] == 1.0 and p3["goodput_requests_per_s"] == 0.0
    assert p3["errors"] == {"truncated": 1} and p3["throughput_total_tokens_per_s"] == 20 / 10

    o = res["overall"]
    assert (o["requests"], o["completed"], o["rejected"], o["failed"], o["unfinished"]) == (
        10, 5, 2, 2, 1,
    )  # fmt: skip
    assert o["sla_attainment"] == 5 / 9
    assert o["goodput_requests_per_s"] == 3 / 10 == res["goodput_requests_per_s"]
    assert o["request_throughput_per_s"] == 5 / 10
    assert o["throughput_tokens_per_s"] == 26 / 10 == res["throughput_tokens_per_s"]
    assert o["throughput_total_tokens_per_s"] == 106 / 10
    assert o["refusals_by_status"] == {"429": 1, "503": 1}
    assert (o["retry_after_p50_s"], o["retry_after_max_s"]) == (2.0, 4.0)
    # TTFTs .25 .5 .75 1 1 1 4 (no first token for d, e, f): nearest rank.
    assert (o["ttft_p50_s"], o["ttft_p95_s"], o["ttft_p99_s"]) == (1.0, 4.0, 4.0)
    assert res["classes"]["P1"]["sla_s"] == 2.0 and res["classes"]["P1"]["tpot_slo_s"] == 0.25


def test_no_window_gives_no_rates(mixed_run):
    res = run_stats(mixed_run, None, (0.5, 2.0, 60.0, None))
    assert res["throughput_tokens_per_s"] is None and res["goodput_requests_per_s"] is None
    assert res["overall"]["ttft_p50_s"] == 1.0  # latencies do not need a window
