"""Issue 46's burst probe in the simulator (sim/burst.py;
benchmarks/simulation/sla_burst_sim.py prints it): requests sent at the same moment to the
CPU engine's step times."""

from __future__ import annotations

from tierserve.sim.burst import burst


def test_a_burst_that_fits_is_admitted_whole_and_on_time():
    off = burst((6, 0, 0, 0), sla_admission=False)["P0"]
    on = burst((6, 0, 0, 0), sla_admission=True)["P0"]
    assert off["on_time"] == 6 and off["worst_ttft_s"] <= 0.5
    assert on == off  # nothing refused that would have been on time


def test_admission_keeps_a_large_burst_from_sinking_everyone():
    off = burst((30, 0, 0, 0), sla_admission=False)["P0"]
    on = burst((30, 0, 0, 0), sla_admission=True)["P0"]
    assert off["admitted"] == 30 and on["admitted"] < 30
    assert on["worst_ttft_s"] < off["worst_ttft_s"]
    assert on["on_time"] / on["admitted"] > off["on_time"] / off["admitted"]


def test_a_mixed_burst_is_made_as_asked_and_served():
    res = burst((3, 4, 5, 6), sla_admission=False)
    assert [res[c]["sent"] for c in ("P0", "P1", "P2", "P3")] == [3, 4, 5, 6]
    assert all(r["admitted"] == r["sent"] for r in res.values())


def test_admission_admits_what_fits_and_keeps_it_on_time():
    """The predictor against the simulated engine's step times: admission admits at least 80%
    of what admission off gets on time, and everything it admits is on time."""
    off = burst((30, 0, 0, 0), sla_admission=False)["P0"]
    on = burst((30, 0, 0, 0), sla_admission=True)["P0"]
    assert on["admitted"] >= 0.8 * off["on_time"]
    assert on["on_time"] == on["admitted"]
