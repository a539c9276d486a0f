"""The simulator stays torch-free; profiles say which file they came from and whether the
machine they were fitted on is this one."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from importlib import resources

import pytest

from tierserve.host.machine import describe, differences, machine_fingerprint
from tierserve.sim.calibration.calibrate import profile_from_fit
from tierserve.sim.calibration.profiles import load_hardware, locate, profile_notes

BLOCK_TORCH = textwrap.dedent(
    """
    import sys

    class Blocker:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "fastapi", "ray"):
                raise ImportError(f"{name} is blocked in this test")

    sys.meta_path.insert(0, Blocker())
    """
)


def test_the_simulator_and_its_command_run_with_torch_blocked(tmp_path):
    script = BLOCK_TORCH + textwrap.dedent(
        f"""
        import tierserve.sim, tierserve.sim.engine.runner, tierserve.sim.scenarios
        import tierserve.sim.fleet.model, tierserve.sim.report.engine, tierserve.sim.report.fleet
        import tierserve.sim.calibration.profiles
        import tierserve.routing
        from tierserve.cli import main

        args = ["simulate", "--hardware", "h100-80gb", "--model", "llama-3.1-8b", "--tp", "1",
                "--concurrency", "8", "--duration", "6", "--warmup", "1", "--workers", "1"]
        assert main(args + ["--policy", "hybrid", "--out", {str(tmp_path / "one")!r}]) == 0
        assert main(args + ["--replicas", "2", "--router", "least-loaded",
                            "--out", {str(tmp_path / "two")!r}]) == 0
        heavy = [m for m in sys.modules if m.split(".")[0] in ("torch", "fastapi", "ray")]
        assert not heavy, heavy
        print("TORCH-FREE OK")
        """
    )
    env = {"TIERSERVE_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "TORCH-FREE OK" in run.stdout
    assert json.loads((tmp_path / "two" / "results.json").read_text())[0]["replicas"] == 2


# -- where a profile comes from ----------------------------------------------------------------


def _shipped(name: str) -> dict:
    return json.loads(
        resources.files("tierserve.sim").joinpath("profiles", f"{name}.json").read_text()
    )


def test_a_users_profile_takes_precedence_and_says_so(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TIERSERVE_CACHE_DIR", str(tmp_path))
    assert locate("h100-80gb")[1] == "shipped"
    assert profile_notes("h100-80gb") == []  # a datasheet profile: nothing to say
    mine = tmp_path / "profiles" / "h100-80gb.json"
    mine.parent.mkdir()
    mine.write_text(json.dumps(_shipped("h100-80gb") | {"peak_flops": 123e12}))
    with caplog.at_level(logging.INFO, logger="tierserve.sim.calibration.profiles"):
        hw = load_hardware("h100-80gb")
    assert hw.peak_flops == 123e12
    assert str(mine) in caplog.text
    notes = profile_notes("h100-80gb")
    assert len(notes) == 1 and str(mine) in notes[0] and "precedence" in notes[0]


# -- the machine a profile was fitted on ---------------------------------------------------------

HERE = {
    "cpu_model": "Example CPU 9000",
    "isa": ["avx", "avx2", "fma", "avx512f"],
    "logical_cpus": 8,
    "threads": 4,
    "torch": "2.13.0",
}


def _fitted(tmp_path, fitted_on: dict | None):
    coef = {
        "step_overhead_s": 0.01,
        "per_seq_overhead_s": 0.001,
        "s_per_lin_flop": 1e-11,
        "s_per_attn_flop": 2e-11,
        "s_per_weight_byte": 0.0,
        "s_per_kv_byte": 1e-10,
    }
    profile = profile_from_fit(coef, 0.05, [([(1, 10)], 1, 0.02)], 1e11, 2e10, "float32", HERE)
    if fitted_on is None:
        del profile["fitted_on"]
    else:
        profile["fitted_on"] = fitted_on
    path = tmp_path / "fitted.json"
    path.write_text(json.dumps(profile))
    assert load_hardware(str(path)).step_overhead_s == 0.01  # a valid profile
    return str(path)


def test_calibrate_records_the_machine_and_the_same_machine_needs_no_warning(tmp_path):
    profile = profile_from_fit(
        {k: 1e-12 for k in ("s_per_lin_flop", "s_per_attn_flop", "s_per_weight_byte")}
        | {"s_per_kv_byte": 1e-12, "step_overhead_s": 0.0, "per_seq_overhead_s": 0.0},
        0.1,
        [],
        1e11,
        1e10,
        "float32",
        HERE,
    )
    assert profile["fitted_on"] == HERE and "Example CPU 9000" in profile["description"]
    assert profile_notes(_fitted(tmp_path, HERE), here=HERE) == []


def test_a_profile_fitted_elsewhere_warns_and_names_the_fix(tmp_path):
    avx2_box = HERE | {"cpu_model": "Other CPU", "isa": ["avx", "avx2", "fma"], "torch": "2.12.0"}
    (note,) = profile_notes(_fitted(tmp_path, HERE), here=avx2_box)
    assert note.startswith("warning:") and "`tierserve calibrate`" in note
    assert "Example CPU 9000" in note
    assert "here lacks avx512f" in note and "torch version: 2.13.0 there, 2.12.0 here" in note
    (note,) = profile_notes(_fitted(tmp_path, None), here=HERE)
    assert "fitted on an unrecorded machine" in note and "`tierserve calibrate`" in note


def test_the_shipped_cpu_profile_is_from_an_unrecorded_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("TIERSERVE_CACHE_DIR", str(tmp_path))
    (note,) = profile_notes("cpu-local")
    assert "unrecorded machine" in note and "cpu-local.json" in note


def test_simulate_prints_the_warning_before_running(tmp_path, monkeypatch, capsys):
    from tierserve.cli import main

    monkeypatch.setenv("TIERSERVE_CACHE_DIR", str(tmp_path))
    fake = tmp_path / "fitted-gpu.json"  # a fitted profile that does not say where
    fake.write_text(json.dumps(_shipped("h100-80gb") | {"fit": {"coefficients": {}}}))
    args = ["simulate", "--hardware", str(fake), "--model", "llama-3.1-8b", "--tp", "1"]
    args += ["--concurrency", "8", "--duration", "6", "--warmup", "1", "--workers", "1"]
    assert main([*args, "--policy", "hybrid", "--out", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert "unrecorded machine" in err and "tierserve calibrate" in err
    assert main(["simulate", "--hardware", "no-such-gpu", "--out", str(tmp_path / "x")]) == 2
    assert "unknown profile 'no-such-gpu'" in capsys.readouterr().err


def test_fingerprint_reads_cpuinfo_on_x86_and_arm():
    x86 = "processor : 0\nmodel name : Some Xeon\nflags : fpu sse4_2 avx avx2 fma amx_tile\n"
    fp = machine_fingerprint(threads=3, cpuinfo=x86)
    assert fp["cpu_model"] == "Some Xeon" and fp["isa"] == [
        "sse4_2",
        "avx",
        "avx2",
        "fma",
        "amx_tile",
    ]
    assert fp["threads"] == 3 and "Some Xeon (sse4_2+avx+avx2+fma+amx_tile)" in describe(fp)
    arm = "processor : 0\nFeatures : fp asimd sve i8mm bf16\nHardware : Graviton\n"
    assert machine_fingerprint(cpuinfo=arm)["isa"] == ["asimd", "sve", "bf16", "i8mm"]
    assert differences(fp, fp) == []
    assert differences(fp, fp | {"logical_cpus": 999}) == [
        f"CPU count: {fp['logical_cpus']} there, 999 here"
    ]


@pytest.mark.parametrize("name", ["a100-80gb", "h100-80gb", "h200-141gb"])
def test_datasheet_profiles_carry_no_fit_and_raise_no_warning(name, tmp_path, monkeypatch):
    monkeypatch.setenv("TIERSERVE_CACHE_DIR", str(tmp_path))
    assert "fit" not in _shipped(name) and profile_notes(name) == []
