"""The server builds its engine on a short-lived thread (OpenMP teams, engine/builder.py)."""

import threading

import pytest

from tierserve.engine import builder


def test_build_runs_on_a_thread_that_is_gone_when_the_engine_starts(monkeypatch):
    seen = []

    def fake_build(args, clock=None, on_stage=None):
        seen.append(threading.current_thread())
        return ("built", args, clock)

    monkeypatch.setattr(builder, "build_engine", fake_build)
    assert builder.build_engine_off_main("args", "clock") == ("built", "args", "clock")
    (thread,) = seen
    assert thread is not threading.main_thread()
    assert thread is not threading.current_thread()
    assert not thread.is_alive()  # its OpenMP team went with it


def test_a_failed_build_raises_on_the_callers_thread(monkeypatch):
    def fake_build(args, clock=None, on_stage=None):
        raise FileNotFoundError("no such model: nowhere.gguf")

    monkeypatch.setattr(builder, "build_engine", fake_build)
    with pytest.raises(FileNotFoundError, match=r"nowhere\.gguf"):
        builder.build_engine_off_main("args")
