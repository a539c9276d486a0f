"""Simulator: cost model against a hand calculation, event ordering, reproducibility, workload,
calibration fit, and the simulate command's outputs."""

import json
from dataclasses import replace

import numpy as np
import pytest

from tierserve.priority import Priority
from tierserve.sim.calibration.profiles import load_hardware, load_model_profile, shipped_profiles
from tierserve.sim.engine.cost_model import CostModel
from tierserve.sim.engine.events import EventKind, EventQueue
from tierserve.sim.engine.runner import SimConfig, run_simulation
from tierserve.workloads.synthetic import Workload, WorkloadConfig


def test_70b_decode_step_on_8_a100_matches_a_hand_calculation():
    """32 requests decode one token each at context 1000, Llama-3.1-70B, TP 8 on A100-80GB."""
    cm = CostModel(load_hardware("a100-80gb"), load_model_profile("llama-3.1-70b"), tp=8)
    # Per layer: q/k/v/o projections + gated MLP = 8192*(8192+2*1024) + 8192*8192 + 3*8192*28672.
    layer = 8192 * 10240 + 8192 * 8192 + 3 * 8192 * 28672
    assert layer == 855_638_016
    params_layers = 80 * layer  # 68,451,041,280
    params_head = 128_256 * 8192  # 1,050,673,152
    flops_linear = 2 * (params_layers + params_head) * 32  # every row samples
    flops_attn = 4 * 80 * 64 * 128 * 32 * 1000  # 1000 (q, k) pairs per request
    compute = flops_linear / 8 / (312e12 * 0.55) + flops_attn / 8 / (312e12 * 0.40)
    weight_bytes = (params_layers + params_head) * 2
    kv_bytes = (32 * 1000 + 32) * (2 * 80 * 1024 * 2)  # contexts read + new tokens written
    memory = (weight_bytes + kv_bytes) / 8 / (2039e9 * 0.80)
    allreduce = 15e-6 + 2 * 7 / 8 * (32 * 8192 * 2) / 230e9
    # two per layer and the embedding's; the logits gathered; the sampled tokens broadcast
    gather = 15e-6 + 7 / 8 * (32 * 128_256 * 4) / 230e9
    expected = 0.004 + max(compute, memory) + (2 * 80 + 1) * allreduce + gather + 15e-6
    assert expected == pytest.approx(0.018606, abs=1e-6)  # memory-bound: ~18.6 ms
    got = cm.step([(1, 1000)] * 32, 32)
    assert got.seconds == pytest.approx(expected, rel=1e-12)
    assert got.memory_s > got.compute_s


def test_kv_capacity_and_swap_cost_follow_from_memory():
    cm = CostModel(load_hardware("a100-80gb"), load_model_profile("llama-3.1-70b"), tp=8)
    per_device = 85_899_345_920 - cm.weight_bytes / 8 - 6_442_450_944
    assert cm.kv_capacity_tokens() == int(per_device * 8 // 327_680)
    assert cm.swap_seconds(100, 16) == pytest.approx(100 * 327_680 * 16 / 8 / 25e9)
    with pytest.raises(ValueError, match="does not fit"):
        CostModel(
            load_hardware("a100-80gb"), load_model_profile("llama-3.1-70b"), 1
        ).kv_capacity_tokens()


def test_shipped_profiles_and_bad_names():
    names = shipped_profiles()
    for n in (
        "a100-80gb",
        "h100-80gb",
        "h200-141gb",
        "cpu-local",
        "llama-3.1-8b",
        "llama-3.1-70b",
        "smollm2-135m",
    ):
        assert n in names
    assert load_hardware("cpu-local").mode == "additive"
    with pytest.raises(ValueError, match="unknown profile"):
        load_hardware("tpu-v9")
    with pytest.raises(ValueError, match="not a hardware profile"):
        load_hardware("llama-3.1-8b")


def test_equal_time_events_follow_the_documented_order():
    q = EventQueue()
    q.push(1.0, EventKind.ARRIVAL, "a1")
    q.push(1.0, EventKind.COMPLETION, "c1")
    q.push(0.5, EventKind.ARRIVAL, "early")
    q.push(1.0, EventKind.ARRIVAL, "a2")
    q.push(2.0, EventKind.COMPLETION, "late")
    got = [p for _, _, p in q.pop_due(1.0)]
    # Time first; at equal time completion < arrival; then insertion order.
    assert got == ["early", "c1", "a1", "a2"]
    assert len(q) == 1 and q.peek_time() == 2.0


SMALL = SimConfig(
    hardware="h100-80gb",
    model="llama-3.1-8b",
    tp=1,
    max_num_seqs=64,
    max_num_batched_tokens=1024,
    workload=WorkloadConfig(concurrency=24, duration_s=40.0, warmup_s=10.0, seed=3),
)


def _strip(r):
    return {k: v for k, v in r.items() if k != "wall_s"}


def test_same_seed_same_results_and_a_different_seed_differs():
    a, b = run_simulation(SMALL), run_simulation(SMALL)
    assert _strip(a) == _strip(b)
    c = run_simulation(replace(SMALL, workload=replace(SMALL.workload, seed=4)))
    assert _strip(c) != _strip(a)
    assert a["completed"] > 50 and a["failed"] == 0 and a["unfinished"] == 0
    assert 0.9 < a["utilization"] <= 1.0001


def test_open_loop_poisson_and_gamma_runs():
    for arrival in ("poisson", "gamma"):
        wl = replace(SMALL.workload, arrival=arrival, rate=3.0)
        r = run_simulation(replace(SMALL, workload=wl))
        n = sum(c["requests"] for c in r["classes"].values())
        assert 60 <= n <= 140  # ~3/s over the 30 s window
        assert r["failed"] == 0


def test_workload_is_reproducible_and_follows_the_mix():
    cfg = WorkloadConfig(seed=11)
    a, b = Workload(cfg), Workload(cfg)
    ra, rb = [a.make(0.0) for _ in range(50)], [b.make(0.0) for _ in range(50)]
    assert [(r.priority, r.prompt_token_ids, r.sampling_params.max_tokens) for r in ra] == [
        (r.priority, r.prompt_token_ids, r.sampling_params.max_tokens) for r in rb
    ]
    w = Workload(cfg)
    reqs = [w.make(0.0) for _ in range(10_000)]
    for p, share in zip(Priority, cfg.mix, strict=True):
        got = sum(r.priority == p for r in reqs) / len(reqs)
        assert abs(got - share) < 0.02
        spec = cfg.classes[p]
        lens = [r.num_prompt_tokens for r in reqs if r.priority == p]
        assert spec.prompt.lo <= min(lens) and max(lens) <= spec.prompt.hi


def test_shared_prefixes_give_prefix_cache_hits():
    wl = replace(SMALL.workload, shared_prefixes=True)
    from tierserve.sim.engine.runner import build

    engine, _, _ = build(replace(SMALL, workload=wl))
    w = Workload(wl)
    for _ in range(40):
        engine.add_request(w.make(0.0))
    while engine.has_unfinished():
        engine.step()
    stats = engine.scheduler.kv.stats()
    assert stats.prefix_hits[Priority.P1] > 0


def test_invalid_workloads_are_refused():
    with pytest.raises(ValueError, match="mix"):
        WorkloadConfig(mix=(1, 1, 1))
    with pytest.raises(ValueError, match="arrival"):
        WorkloadConfig(arrival="bursty")
    with pytest.raises(ValueError, match="warmup"):
        WorkloadConfig(duration_s=10, warmup_s=20)


def test_nnls_recovers_known_non_negative_coefficients():
    from tierserve.sim.calibration.calibrate import _nnls

    rng = np.random.default_rng(0)
    a = rng.uniform(0, 1, (60, 6))
    x = np.array([0.5, 0.0, 2.0, 0.0, 1.5, 0.25])
    got = _nnls(a, a @ x)
    assert np.allclose(got, x, atol=1e-8)
    assert (_nnls(a, a @ x - 5.0) >= 0).all()


def test_calibration_fit_recovers_a_synthetic_additive_machine():
    from tierserve.sim.calibration.calibrate import fit
    from tierserve.sim.calibration.profiles import HardwareProfile

    hw = HardwareProfile(
        name="truth",
        mode="additive",
        peak_flops=1e11,
        mem_bandwidth=2e10,
        memory_bytes=0,
        compute_efficiency=0.5,
        attention_efficiency=0.25,
        memory_efficiency=0.5,
        allreduce_bus_bandwidth=1,
        allreduce_latency_s=0,
        pcie_bandwidth=1e10,
        step_overhead_s=0.02,
        per_seq_overhead_s=0.001,
        activation_headroom_bytes=0,
        kv_memory_efficiency=0.1,
    )
    model = load_model_profile("smollm2-135m")
    truth = CostModel(hw, model, 1)
    rng = np.random.default_rng(1)
    rows = []
    for _ in range(200):
        chunks = [(int(rng.integers(1, 400)), 0) for _ in range(int(rng.integers(1, 4)))]
        chunks = [(n, n + int(rng.integers(0, 600))) for n, _ in chunks]
        chunks += [(1, int(rng.integers(2, 900))) for _ in range(int(rng.integers(0, 40)))]
        rows.append((chunks, len(chunks), truth.step(chunks, len(chunks)).seconds))
    coef, err = fit(rows, truth)
    assert err < 1e-6
    assert coef["per_seq_overhead_s"] == pytest.approx(0.001, rel=1e-6)
    assert coef["s_per_lin_flop"] == pytest.approx(1 / (1e11 * 0.5), rel=1e-6)
    assert coef["s_per_attn_flop"] == pytest.approx(1 / (1e11 * 0.25), rel=1e-6)
    assert coef["s_per_kv_byte"] == pytest.approx(1 / (2e10 * 0.1), rel=1e-6)
    # Every step reads the same weights, so that term and the fixed overhead are one constant.
    weight_s = truth.features([(1, 1)], 1)[3] / (2e10 * 0.5)
    assert coef["step_overhead_s"] + coef["s_per_weight_byte"] * truth.features([(1, 1)], 1)[3] == (
        pytest.approx(0.02 + weight_s, rel=1e-6)
    )


def test_simulate_command_writes_results_report_and_plots(tmp_path):
    from tierserve.cli import main

    out = tmp_path / "sim"
    rc = main(
        [
            "simulate",
            "--policy",
            "fcfs",
            "--policy",
            "hybrid",
            "--concurrency",
            "8",
            "16",
            "--hardware",
            "h100-80gb",
            "--model",
            "llama-3.1-8b",
            "--tp",
            "1",
            "--duration",
            "30",
            "--warmup",
            "5",
            "--workers",
            "1",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    results = json.loads((out / "results.json").read_text())
    assert {(r["policy"], r["concurrency"]) for r in results} == {
        ("fcfs", 8),
        ("fcfs", 16),
        ("hybrid", 8),
        ("hybrid", 16),
    }
    r = results[0]
    for key in (
        "throughput_tokens_per_s",
        "throughput_total_tokens_per_s",
        "utilization",
        "failed",
        "preemptions",
        "kv_usage_series",
    ):
        assert key in r
    assert r["classes"]["P0"]["ttft_p95_s"] is None or r["classes"]["P0"]["ttft_p95_s"] > 0
    assert "sla_attainment" in r["classes"]["P1"]
    report = (out / "report.md").read_text()
    assert "## P0 P95 time to first token" in report and "| 16 |" in report
    for png in ("ttft_p95.png", "kv_usage.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_seed_table_grid_is_the_seed_design():
    from tierserve.sim.scenarios import seed_table_configs

    cfgs = seed_table_configs()
    grid = {(c.policy, c.workload.concurrency) for c in cfgs}
    assert grid == {(p, c) for p in ("fcfs", "drr", "hybrid") for c in (32, 64, 128, 256, 512)}
    assert all(
        c.model == "llama-3.1-70b"
        and c.tp == 8
        and c.hardware == "a100-80gb"
        and c.block_size == 16
        for c in cfgs
    )


def test_driver_records_a_request_the_scheduler_ends_without_running_anything():
    """A lone request that outgrows a tiny KV cache is finished inside schedule(); the driver
    must record its end (issue 14 item 1: the same early-return shape as the engine loop)."""
    from tierserve.admission import AdmissionController
    from tierserve.clock import ManualClock
    from tierserve.config import AdmissionConfig, CacheConfig, PartitionConfig, SchedulerConfig
    from tierserve.engine import EngineCore
    from tierserve.executor.fake import FakeExecutor
    from tierserve.request import Request
    from tierserve.sampling_params import SamplingParams
    from tierserve.sim.engine.driver import drive

    class OneLongRequest(Workload):
        def make(self, now):
            self._n += 1
            return Request(
                f"long-{self._n}",
                [5] * 6,
                SamplingParams(max_tokens=100, ignore_eos=True),
                priority=Priority.P1,
                arrival_time=now,
            )

    clock = ManualClock()
    flat = PartitionConfig(p0_floor_min=0, p0_floor_max=0, p0_ceiling=1.0, p1_reserve=0)
    eng = EngineCore.build(
        FakeExecutor(4, 4),
        clock,
        CacheConfig(4, 4, partitions=flat),
        SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=4096),
    )
    wl = OneLongRequest(WorkloadConfig(arrival="poisson", rate=0.001, duration_s=2.0, warmup_s=0))
    adm = AdmissionController(AdmissionConfig(), eng.scheduler, clock)

    def idle_until(t):
        clock.advance(max(0.0, t - clock.now()))

    run_step = eng.step

    def step_taking_10ms():
        clock.advance(0.01)
        return run_step()

    eng.step = step_taking_10ms
    wl.gap = lambda: 0.5 if wl._n == 0 else 1e9  # one arrival, then none
    result = drive(eng, wl, adm, idle_until)
    assert [r.outcome for r in result.records] == ["failed"]  # truncated at `length`
    assert result.records[0].finish is not None and result.records[0].output_tokens > 0


def test_simulate_gamma_cv_flag_reaches_the_workload():
    """Issue 14 item 11: --gamma-cv was parsed and then dropped."""
    import statistics

    from tierserve.cli import build_parser
    from tierserve.cli.simulate import workload_config

    def gaps(cv: str) -> list[float]:
        args = build_parser().parse_args(["simulate", "--arrival", "gamma", "--gamma-cv", cv])
        wl = Workload(workload_config(args))
        return [wl.gap() for _ in range(4000)]

    for cv in ("0.5", "3"):
        g = gaps(cv)
        assert statistics.stdev(g) / statistics.mean(g) == pytest.approx(float(cv), rel=0.15)


def test_plots_are_written_when_no_class_got_a_first_token(tmp_path):
    """A run too short for any first token used to raise 'Data cannot be log-scaled'."""
    from tierserve.sim.report.engine import write_plots

    cls = {"ttft_p95_s": None, "sla_s": None}
    series = [{"t": 0.0, "floor": 0, "reserve": 0, "shared": 0, "borrowed": 0}]
    results = [
        {
            "policy": "fcfs",
            "concurrency": c,
            "classes": {f"P{i}": dict(cls) for i in range(4)},
            "kv_usage_series": series,
            "kv_blocks": 10,
        }
        for c in (8, 16)
    ]
    paths = write_plots(results, tmp_path)
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)


def test_open_loop_arrivals_keep_their_rate_when_steps_are_longer_than_the_gaps():
    """Issue 21: the driver used to pop one arrival per engine step, so with 0.1 s steps an
    open loop of 40 requests/s ran at 10/s and every request reached the engine later and later
    after its arrival time. Each must be submitted at the first step boundary after it."""
    from tierserve.admission import AdmissionController
    from tierserve.clock import ManualClock
    from tierserve.config import AdmissionConfig, CacheConfig, SchedulerConfig
    from tierserve.engine import EngineCore
    from tierserve.executor.fake import FakeExecutor
    from tierserve.sim.engine.driver import drive

    clock = ManualClock()
    eng = EngineCore.build(
        FakeExecutor(4096, 16),
        clock,
        CacheConfig(16, 4096),
        SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=1 << 16),
    )
    from tierserve.workloads.synthetic import ClassSpec, LengthDist

    short = ClassSpec(LengthDist(16, 0.1, 8, 32), LengthDist(2, 0.1, 1, 4))
    classes = dict.fromkeys(Priority, short)
    cfg = WorkloadConfig(
        arrival="poisson", rate=40.0, duration_s=10.0, warmup_s=0.0, classes=classes
    )
    wl = Workload(cfg)
    adm = AdmissionController(AdmissionConfig(), eng.scheduler, clock)
    added = {}
    run_step, add = eng.step, eng.add_request

    def step_taking_100ms():
        clock.advance(0.1)
        return run_step()

    def add_and_note(req):
        added[req.request_id] = clock.now() - req.arrival_time
        add(req)

    eng.step, eng.add_request = step_taking_100ms, add_and_note
    result = drive(eng, wl, adm, lambda t: clock.advance(max(0.0, t - clock.now())))
    assert 300 < len(result.records) < 500
    assert max(added.values()) <= 0.1 + 1e-9  # at most one step after it arrived
    assert result.end_time < 10.0 + 1.0


def test_preemption_time_counts_recomputed_tokens_at_their_marginal_step_cost():
    """A request computed to 10 tokens, preempted for recompute, then resumed: its 10 tokens
    computed again are recomputation, priced as what they add to the step; the 11th is not."""
    from tierserve.clock import ManualClock
    from tierserve.core.outputs import NewRequestData, SchedulerOutput
    from tierserve.sampling_params import SamplingParams
    from tierserve.sim.engine.executor import SimExecutor

    cm = CostModel(load_hardware("a100-80gb"), load_model_profile("llama-3.1-8b"), tp=1)
    ex = SimExecutor(cm, ManualClock(), 16)

    def new(tokens):
        return NewRequestData("r", list(range(tokens)), 10, SamplingParams(), [0], 0)

    ex.execute(SchedulerOutput(1, [new(10)], num_scheduled_tokens={"r": 10}))
    assert (ex.totals.recompute_tokens, ex.totals.recompute_s) == (0, 0.0)
    ex.execute(SchedulerOutput(2, preempted_req_ids={"r"}))
    ex.execute(SchedulerOutput(3, [new(11)], num_scheduled_tokens={"r": 11}))
    assert ex.totals.recompute_tokens == 10
    marginal = cm.step([(11, 11)], 1).seconds - cm.step([(1, 11)], 1).seconds
    assert ex.totals.recompute_s == pytest.approx(marginal, rel=1e-12)
    assert ex.totals.recompute_s > 0
    # Finished: a new request under the same id computes nothing again.
    ex.execute(SchedulerOutput(4, finished_req_ids={"r"}))
    ex.execute(SchedulerOutput(5, [new(10)], num_scheduled_tokens={"r": 10}))
    assert ex.totals.recompute_tokens == 10


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_a_run_reports_the_preemption_time_of_its_mode(mode):
    from tierserve.sim.scenarios import MEMORY_PRESSURE_BASE

    wl = replace(
        MEMORY_PRESSURE_BASE.workload,
        lengths="heavy_tail",
        duration_s=40.0,
        warmup_s=10.0,
        concurrency=256,
    )
    r = run_simulation(replace(MEMORY_PRESSURE_BASE, preemption_mode=mode, workload=wl))
    t, p = r["preemption_time"], r["preemptions"]
    assert p[mode] > 0 and p["swap" if mode == "recompute" else "recompute"] == 0
    if mode == "swap":
        assert t["swap_s"] > 0 and t["recompute_tokens"] == 0 and t["recompute_s"] == 0
    else:
        assert t["swap_s"] == 0 and t["recompute_tokens"] > 0 and t["recompute_s"] > 0
    assert t["total_s"] == pytest.approx(t["swap_s"] + t["recompute_s"], abs=2e-3)


def test_simulate_flags_for_heavy_tails_prediction_and_preemption_reach_the_run(tmp_path, capsys):
    from tierserve.cli import main

    out = tmp_path / "sim"
    base = ["simulate", "--policy", "hybrid", "--concurrency", "64", "--duration", "20"]
    base += ["--warmup", "5", "--workers", "1", "--out", str(out)]
    flags = ["--lengths", "heavy-tail", "--predictive", "order", "reserve"]
    assert main(base + flags + ["--preemption-mode", "recompute"]) == 0
    (r,) = json.loads((out / "results.json").read_text())
    cfg = r["config"]
    assert cfg["workload"]["lengths"] == "heavy_tail" and cfg["preemption_mode"] == "recompute"
    assert cfg["predictive_order_s"] > 0 and cfg["predictive_reserve"]
    assert not cfg["predictive_ttft"] and not cfg["predictive_routing"]
    assert r["preemptions"]["swap"] == 0
    assert sum(e["n"] for e in r["predictor_error"].values()) > 0  # it checked predictions
    capsys.readouterr()
    assert main([*base, "--predictive", "sooner"]) == 2
    assert "--predictive takes off, all or some of order" in capsys.readouterr().err
    assert main(["simulate", "--scenario", "seed-table", "--lengths", "heavy-tail"]) == 2
    assert "apply to custom runs" in capsys.readouterr().err


def test_tensor_parallel_costs_what_the_engine_communicates():
    """tp=1: no communication; tp=2: the embedding's and each layer's two all-reduces, and,
    when a row samples, the logits gathered and the tokens broadcast."""
    hw, model = load_hardware("h100-80gb"), load_model_profile("llama-3.1-8b")
    one, two = CostModel(hw, model, tp=1), CostModel(hw, model, tp=2)
    assert one.step([(1, 100)] * 4, 4).comm_s == 0.0
    c = model.config
    reduce = hw.allreduce_latency_s + 2 * 0.5 * (4 * c.hidden_size * 2) / hw.allreduce_bus_bandwidth
    prefill = two.step([(4, 4)], 0).comm_s  # no row samples: no logits, no tokens
    assert prefill == pytest.approx((2 * c.num_layers + 1) * reduce, rel=1e-12)
    gather = hw.allreduce_latency_s + 0.5 * (4 * c.vocab_size * 4) / hw.allreduce_bus_bandwidth
    decode = two.step([(1, 100)] * 4, 4).comm_s
    assert decode == pytest.approx(prefill + gather + hw.allreduce_latency_s, rel=1e-12)


def test_the_fleet_scenarios_take_each_replicas_tensor_parallel_size(monkeypatch, tmp_path):
    from tierserve.cli import main
    from tierserve.sim import scenarios

    seen = []

    def grid(configs, workers):  # the configs only: the scenario's runs take minutes
        seen.extend(configs)
        raise SystemExit(0)

    monkeypatch.setattr(scenarios, "run_grid", grid)
    for scenario in ("fleet", "fleet-ingress"):
        seen.clear()
        with pytest.raises(SystemExit):
            main(["simulate", "--scenario", scenario, "--tp", "2", "--out", str(tmp_path)])
        assert seen and all(c.sim.tp == 2 for c in seen)
