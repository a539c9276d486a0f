"""What a new user meets starting the server (issue 23, items 7-10): vLLM's flag names, a "did
you mean" for an unknown flag, `--version`, clear one-line errors for a wrong `--model`, the
served name rule, `--cpu-threads` and its auto choice, the context clamp, and the start-up log
line (model, architecture, dtype, context, KV blocks, threads)."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time

import httpx
import pytest
import torch

from tests.server_utils import free_port
from tierserve import cli
from tierserve.cli.serve import build_configs, merged_options
from tierserve.engine.args import resolve_defaults


def parse(*argv):
    return build_configs(merged_options(cli.build_parser().parse_args(["serve", *argv])))


def run_cli(*argv) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tierserve", *argv], capture_output=True, text=True, timeout=60
    )


# -- item 8: vLLM's flags ------------------------------------------------------------------------


CPU_TORCH = torch.version.cuda is None


def test_vllm_gpu_flags_mean_the_same_here():
    args, _ = parse("--gpu-memory-utilization", "0.8", "--enforce-eager")
    assert args.gpu_memory_utilization == 0.8 and args.enforce_eager
    args, _ = parse()
    assert args.gpu_memory_utilization == 0.9 and not args.enforce_eager
    assert args.kv_cache_gib is None  # a device default: 1 GiB on cpu, by utilization on cuda
    assert resolve_defaults(args, "cpu").kv_cache_gib == 1.0
    assert resolve_defaults(args, "cuda").kv_cache_gib is None


def test_vllm_names_that_mean_the_same_are_accepted(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(16))
    args, _ = parse(str(gguf), "-tp", "1", "--enable-prefix-caching", "--trust-remote-code")
    assert args.model == str(gguf) and args.enable_prefix_caching
    args, _ = parse("--no-enable-prefix-caching", "--scheduling-policy", "priority")
    assert not args.enable_prefix_caching and args.policy.name == "strict"
    args, _ = parse("--tensor-parallel-size", "1", "--scheduling-policy", "fcfs")
    assert args.policy.name == "fcfs" and args.tensor_parallel_size == 1
    args, _ = parse("-tp", "2")
    assert args.tensor_parallel_size == 2
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("scheduling_policy: priority\ntensor_parallel_size: 1\n")
    args, _ = parse("--config", str(cfg))
    assert args.policy.name == "strict"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["-tp", "0"], "tensor_parallel_size must be at least 1, got 0"),
        (["--gpu-memory-utilization", "1.5"], "gpu_memory_utilization must lie in (0, 1]"),
        (["--device", "cuda"], "--device cuda: this torch"),
        (["--scheduling-policy", "priority", "--policy", "wfq"], "contradicts --policy"),
        (["--policy", "hybird"], "did you mean 'hybrid'"),
        (["--cpu-threads", "none"], "--cpu-threads"),
    ],
)
def test_flags_that_do_not_apply_are_one_line_errors(argv, needle):
    if argv[:2] == ["--device", "cuda"] and not CPU_TORCH:
        pytest.skip("this torch has CUDA")
    r = run_cli("serve", *argv)
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("tierserve serve: ") and needle in line


def test_an_unknown_flag_prints_serves_usage_and_the_closest_flag(capsys):
    assert cli.main(["serve", "--max-num-batch-tokenz", "64"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: tierserve serve")
    assert "unrecognized argument --max-num-batch-tokenz" in err
    assert "did you mean --max-num-batched-tokens?" in err


def test_version(capsys):
    import tierserve

    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"tierserve {tierserve.__version__}"


# -- item 9: a wrong --model is one line and exit 2 ----------------------------------------------


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda p: p / "missing.gguf", "no such file or folder"),
        (lambda p: p, "no config.json"),
        (lambda p: (p / "w.bin").write_bytes(b"x") and p / "w.bin", "not a GGUF file"),
        (lambda p: (p / "w.gguf").write_bytes(b"ZZZZ") and p / "w.gguf", "not a GGUF file"),
    ],
)
def test_a_wrong_model_path_is_one_line_and_exit_2(tmp_path, make, needle):
    r = run_cli("serve", "--model", str(make(tmp_path)))
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert needle in line and "Traceback" not in r.stderr


def test_max_model_len_above_the_models_is_clamped_and_logged(caplog):
    from tierserve.engine.builder import context_length

    with caplog.at_level(logging.WARNING, logger="tierserve.engine"):
        assert context_length(100_000, 8192) == 8192
    assert "--max-model-len 100000 is above the model's context of 8192" in caplog.text
    caplog.clear()
    assert context_length(2048, 8192) == 2048 and context_length(None, 8192) == 8192
    assert caplog.text == ""


# -- item 10: one naming rule --------------------------------------------------------------------


def test_the_served_name_drops_the_gguf_quantization_tag():
    from tierserve.cli.serve_model import served_name
    from tierserve.model.loader import default_model_path

    assert served_name(None) == "SmolLM2-135M-Instruct"
    assert served_name(str(default_model_path())) == "SmolLM2-135M-Instruct"
    assert served_name("/m/Qwen2.5-0.5B-Instruct-Q8_0.gguf") == "Qwen2.5-0.5B-Instruct"
    assert served_name("/m/llama-3.1-8b.F16.gguf") == "llama-3.1-8b"
    assert served_name("/m/model-IQ4_XS.gguf") == "model"
    assert served_name("/m/Llama-3.2-1B.gguf") == "Llama-3.2-1B"
    assert served_name("/m/hf/SmolLM2-360M/") == "SmolLM2-360M"
    _, settings = parse("--served-model-name", "a", "b")
    assert settings.served_model_names == ("a", "b")


# -- item 7: threads -----------------------------------------------------------------------------


def test_cpu_threads_flag_and_the_auto_choice(monkeypatch):
    from tierserve.host.threads import ThreadChoice, choose_threads, parse_threads

    assert parse("--cpu-threads", "1")[0].cpu_threads == 1
    assert parse("--cpu-threads", "auto")[0].cpu_threads is None
    assert parse()[0].cpu_threads is None  # auto: resolved when serving
    assert parse_threads("3") == 3
    from tierserve.host import threads as cpu_threads

    monkeypatch.setattr(cpu_threads, "available_cpus", lambda: 2)
    monkeypatch.setattr(cpu_threads, "busy_elsewhere", lambda s=0: 1.0)
    auto = choose_threads(None)
    assert auto.threads == 1 and auto.warning() is None
    assert "1 CPU thread(s) of 2 (auto; 1.0 of 2 CPUs busy" in auto.describe()
    forced = choose_threads(2)
    assert forced.threads == 2 and "try --cpu-threads 1" in forced.warning()
    monkeypatch.setattr(cpu_threads, "busy_elsewhere", lambda s=0: 2.0)
    both = choose_threads(None)
    assert both.threads == 1 and both.warning() is None  # one is the least: nothing to advise
    monkeypatch.setattr(cpu_threads, "busy_elsewhere", lambda s=0: 0.1)
    assert choose_threads(None).threads == 2
    monkeypatch.setattr(cpu_threads, "busy_elsewhere", lambda s=0: None)  # no /proc/stat
    assert choose_threads(None) == ThreadChoice(2, 2, None, "auto")


def test_busy_elsewhere_sees_another_busy_process():
    """A real measurement: a process spinning on one core counts as about one busy core."""
    from tierserve.host.threads import busy_elsewhere

    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        seen = busy_elsewhere(0.5)
    finally:
        spin.kill()
        spin.wait()
    assert seen is not None and seen >= 0.7, seen


@pytest.mark.model
def test_the_start_up_line_and_the_engine_threads(tmp_path):
    """`tierserve serve --cpu-threads 1` as a process: the start-up line names what is served,
    and the engine thread itself reports the thread count it runs with."""
    port = free_port()
    log = tmp_path / "serve.log"
    cmd = ["serve", "--port", str(port), "--kv-cache-gib", "0.1", "--cpu-threads", "1"]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tierserve", *cmd], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        for _ in range(480):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, log.read_text()
            time.sleep(0.25)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    (line,) = [x for x in text.splitlines() if "serving SmolLM2-135M-Instruct" in x]
    for part in (
        "architecture LlamaForCausalLM",
        "dtype float32",
        "context 8192 tokens",
        "blocks of 16",
    ):
        assert part in line, line
    assert "1 CPU thread(s) of" in line and "--cpu-threads" in line
    assert "engine thread: 1 CPU thread(s)" in text


@pytest.mark.model
def test_llm_takes_cpu_threads_on_its_own_thread():
    import torch

    from tierserve import LLM, SamplingParams

    before = torch.get_num_threads()
    try:
        llm = LLM(cpu_threads=1)
        assert torch.get_num_threads() == 1  # the thread that steps the engine
        out = llm.generate("Hi", SamplingParams(max_tokens=2, temperature=0))
        assert out[0].token_ids
    finally:
        torch.set_num_threads(before)
