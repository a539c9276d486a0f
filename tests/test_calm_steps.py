"""Calm steps (core/calm.py): while P0 traffic is about, background decodes are paced so that a
step's decodes fit a tenth of P0's SLA; the held ones keep their seats, take turns, and all
progress; without recent P0 nothing is held."""

from __future__ import annotations

from tests.test_engine_properties import build as build_engine
from tests.test_engine_properties import make_specs, to_request
from tests.test_spec_core import FixedTime
from tierserve.core.calm import CalmSteps
from tierserve.priority import Priority
from tierserve.sampling_params import SamplingParams

# 10 ms a step plus 4 ms a decode: a calm step (0.05 s) holds at most 10 decodes
COEF = (0.01, 0.002, 0.002, 0.0, 0.0, 0.0)


def engine_with(background: int, p0: bool):
    eng, clock = build_engine("hybrid", 4096, "auto", seqs=64)
    s = eng.scheduler
    s.step_time = FixedTime(COEF)
    s.calm = CalmSteps(0.1, 10.0, s.policy.priorities.sla(Priority.P0))  # --p0-calm-fraction 0.1
    specs = make_specs(background + 1, seed=2, max_prompt=50)
    for i, s in enumerate(specs):
        req = to_request(s, clock.now())
        if i == 0:
            if not p0:
                continue
            req.priority = req.base_priority = Priority.P0
        else:
            req.priority = req.base_priority = Priority.P3
        req.sampling_params = SamplingParams(max_tokens=200 if i else 1, temperature=0.0)
        eng.add_request(req)
    return eng, clock


def run_steps(eng, clock, n):
    decoded: dict[str, int] = {}
    sizes = []
    for _ in range(n):
        out = eng.scheduler.schedule()
        before = {r: q.num_output_tokens for r, q in eng.scheduler.running.items()}
        result = eng.executor.execute(out)
        eng.scheduler.update_from_output(out, result)
        sizes.append(sum(1 for n in out.num_scheduled_tokens.values() if n == 1))
        for rid, was in before.items():
            req = eng.scheduler.requests.get(rid)
            if req is not None and req.num_output_tokens > was:
                decoded[rid] = decoded.get(rid, 0) + 1
        clock.advance(0.01)
    return decoded, sizes


def test_background_decodes_are_paced_while_p0_is_about_and_all_progress():
    eng, clock = engine_with(30, p0=True)
    decoded, sizes = run_steps(eng, clock, 60)
    calm = eng.scheduler.calm
    assert calm.held_total > 0
    assert max(sizes[-20:]) <= 10  # a calm step: at most 10 decodes fit 0.05 s
    assert len(decoded) == 30 and min(decoded.values()) >= 5  # every one took turns


def test_nothing_is_held_without_recent_p0():
    eng, clock = engine_with(30, p0=False)
    _, sizes = run_steps(eng, clock, 40)
    assert eng.scheduler.calm.held_total == 0 and max(sizes) == 30


def test_off_by_default_and_checked():
    import pytest

    from tierserve.config import SchedulerConfig

    eng, _clock = build_engine("hybrid", 4096, "auto", seqs=64)
    assert eng.scheduler.calm.bound is None
    with pytest.raises(ValueError, match="p0_calm_fraction"):
        SchedulerConfig(p0_calm_fraction=2.0)


def test_pacing_ends_when_p0_has_been_gone_for_a_while():
    eng, clock = engine_with(30, p0=True)
    run_steps(eng, clock, 10)
    clock.advance(eng.scheduler.config.p0_recent_s + 1)
    held = eng.scheduler.calm.held_total
    _, sizes = run_steps(eng, clock, 5)
    assert eng.scheduler.calm.held_total == held and max(sizes) == 30


def test_only_batch_lines_are_paced_by_default():
    """The default (no --p0-calm-fraction): P3 lines of a Batch API batch are paced while P0 is
    about; interactive P3 decodes are not."""
    eng, clock = build_engine("hybrid", 4096, "auto", seqs=64)
    s = eng.scheduler
    s.step_time = FixedTime(COEF)
    assert s.calm.bound is None and s.calm.batch_bound is not None  # the defaults
    specs = make_specs(41, seed=3, max_prompt=50)
    for i, sp in enumerate(specs):
        req = to_request(sp, clock.now())
        req.priority = req.base_priority = Priority.P0 if i == 0 else Priority.P3
        req.batch_line = 1 <= i <= 20  # 20 batch lines, 20 interactive P3
        req.sampling_params = SamplingParams(max_tokens=200 if i else 1, temperature=0.0)
        eng.add_request(req)
    decoded, _sizes = run_steps(eng, clock, 40)
    batch = {f"s3-{i}" for i in range(1, 21)}
    assert s.calm.held_total > 0
    interactive = [n for rid, n in decoded.items() if rid not in batch]
    lines = [n for rid, n in decoded.items() if rid in batch]
    assert min(interactive) > max(lines)  # the interactive P3 decode every step; lines take turns
    # every line progresses; at least one decodes in every step (here the 20 interactive
    # decodes alone overrun the calm bound, so one line a step)
    assert min(lines) >= 1 and sum(lines) >= 30


def test_the_feeder_marks_its_requests_as_batch_lines(tmp_path):
    import httpx

    from tests.batch_utils import client, completion_line, upload, wait_status
    from tests.fake_engine import fake_built, words
    from tests.server_utils import running_server
    from tierserve.api.settings import ServerSettings

    built = fake_built(step_s=0.0)
    seen: list[tuple[str, bool]] = []
    add = built.engine.add_request

    def record(req):  # on the engine thread; read after the server has stopped
        seen.append((req.request_id, req.batch_line))
        add(req)

    built.engine.add_request = record
    settings = ServerSettings(batch_db=str(tmp_path / "b.db"), files_dir=str(tmp_path / "f"))
    with running_server(built, settings) as (url, _):
        c = client(url)
        f = upload(c, [completion_line(f"c{i}", words(5, i + 1), 4) for i in range(3)])
        b = c.batches.create(input_file_id=f.id, endpoint="/v1/completions", completion_window="1h")
        assert wait_status(c, b.id).status == "completed"
        body = {"prompt": words(5), "max_tokens": 4}
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 200
    assert [flag for _, flag in seen] == [True, True, True, False]
