"""vLLM's `serve` flags (issue 42, item 1): each is taken with the same meaning, a different one,
accepted without effect, or refused with one line naming what to use; hints never point at an
unrelated flag; docs/api.md's table is the code's; `--tokenizer` serves a folder without one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_serve_start import run_cli
from tierserve import cli
from tierserve.cli.serve import build_configs, merged_options
from tierserve.cli.serve_vllm import (
    ACCEPTED,
    REFUSED,
    VLLM_FLAGS,
    closest_flag,
    markdown_table,
)

ROOT = Path(__file__).resolve().parent.parent


def parse(*argv):
    opts = merged_options(cli.build_parser().parse_args(["serve", *argv]))
    return (*build_configs(opts), opts["_notes"])


def test_the_launch_flags_of_a_vllm_script_are_taken():
    args, settings, notes = parse(
        "--enforce-eager", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--disable-log-requests", "--uvicorn-log-level", "warning",
        "--generation-config", "vllm", "--chat-template-content-format", "auto",
        "--pipeline-parallel-size", "1", "--swap-space", "2", "--enable-chunked-prefill",
    )  # fmt: skip
    assert args.enforce_eager and args.swap_space_gib == 2.0
    assert settings.log_level == "warning"
    assert any("--enable-auto-tool-choice" in n for n in notes)
    assert any("--disable-log-requests" in n for n in notes)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--revision", "main"], "--revision: tierserve downloads nothing"),
        (["--enable-lora", "--max-lora-rank", "16"], "LoRA adapters are not supported"),
        (["--pipeline-parallel-size", "2"], "--pipeline-parallel-size 2: not supported"),
        (["--tool-call-parser", "mistral"], "--tool-call-parser mistral: not supported"),
        (["--generation-config", "auto"], "no generation_config.json defaults"),
        (["-dp", "2"], "use --replicas N"),
        (["--tokenizer", "/nonexistent"], "--tokenizer /nonexistent: give a folder"),
    ],
)
def test_a_vllm_flag_that_does_not_apply_is_one_line(argv, needle):
    r = run_cli("serve", *argv)
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("tierserve serve: ") and needle in line, line


def test_every_flag_in_the_table_parses_and_refused_ones_name_an_alternative():
    parser = cli.build_parser()
    serve = next(a for a in parser._actions if hasattr(a, "choices") and a.choices)
    known = {s for a in serve.choices["serve"]._actions for s in a.option_strings}
    for f in VLLM_FLAGS:
        assert f.flag in known, f.flag  # ours, or added by the table: never "unrecognized"
        if f.verdict == REFUSED:
            assert f.note, f.flag
        if f.verdict == ACCEPTED:
            assert f.note, f.flag


def test_hints_share_a_word_with_the_flag():
    known = [s for a in cli.build_parser()._subparsers._group_actions[0].choices["serve"]._actions
             for s in a.option_strings]  # fmt: skip
    assert closest_flag("--max-num-batch-tokenz", known) == "--max-num-batched-tokens"
    assert closest_flag("--tokenizr", known) == "--tokenizer"
    assert closest_flag("--revison", known) == "--revision"
    assert closest_flag("--quux-frobnicate", known) is None
    for bad in ("--reversion", "--tokenise"):
        hint = closest_flag(bad, known)
        assert (
            hint is None
            or set(hint[2:].split("-")) & set(bad[2:].split("-"))
            or (hint[2:5] == bad[2:5])
        ), (bad, hint)


def test_the_docs_table_is_the_codes():
    text = (ROOT / "docs" / "api.md").read_text()
    start = text.index("<!-- vllm-flags")
    block = text[text.index("\n", start) + 1 : text.index("<!-- /vllm-flags -->")].strip()
    assert block == markdown_table()


def test_a_model_folder_without_a_tokenizer(tmp_path):
    from tests.test_architectures import save_tiny
    from tierserve import LLM, SamplingParams

    folder = tmp_path / "m"
    save_tiny(folder, "LlamaForCausalLM")
    tok = tmp_path / "tok"
    tok.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).rename(tok / name)
    r = run_cli("serve", "--model", str(folder))
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert "no tokenizer.json; give --tokenizer PATH" in line
    llm = LLM(model=str(folder), tokenizer=str(tok), kv_cache_gib=0.01)
    (out,) = llm.generate(["w3 w4"], SamplingParams(max_tokens=3, temperature=0))
    assert len(out.token_ids) == 3 and out.error is None
    assert json.loads((tok / "tokenizer_config.json").read_text())["eos_token"] == "w1"


def test_a_bad_simulate_argument_is_one_line():
    r = run_cli("simulate", "--replicas", "2", "--sla-admission", "on", "--duration", "20")
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    assert line == (
        "tierserve simulate: --warmup 150 s must be shorter than --duration 20 s "
        "(what is measured is the rest)"
    )


def test_each_active_feature_has_a_start_up_line():
    from tierserve.server import feature_lines

    args, _, _ = parse(
        "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}',
        "--predictive", "order", "ttft", "--sla-admission", "on", "--no-prefix-caching",
    )  # fmt: skip
    lines = feature_lines(args)
    assert lines[0].startswith("speculative decoding: n-gram lookup, up to 3 drafts, for P0, P1")
    assert "predictive scheduling: order, ttft" in lines
    assert any(x.startswith("SLA admission: on (margin 0.8; TTFT targets P0 0.5 s") for x in lines)
    assert "prefix caching: off" in lines
    plain, _, _ = parse("--prefix-retention", "0", "0", "0", "0")
    assert feature_lines(plain) == []
    tp, _, _ = parse("--prefix-retention", "0", "0", "0", "0", "-tp", "2")
    assert feature_lines(tp) == [
        "tensor parallel: the model split over 2 processes (KV sizes per rank)"
    ]


def test_serve_help_is_grouped_and_every_option_is_in_one_group():
    from tierserve.cli.serve import GROUPS
    from tierserve.cli.serve_options import OPTIONS

    grouped = [f for flags in GROUPS.values() for f in flags]
    assert sorted(grouped) == sorted(o.flag for o in OPTIONS)  # each once, none left out
    text = run_cli("serve", "--help").stdout
    text = text[text.index("\noptions:") :]  # (past the usage line)
    heads = [f"{title}:" for title in GROUPS]
    positions = [text.index(h) for h in heads]
    assert positions == sorted(positions)
    assert text.index("--tokenizer") < text.index("server:") < text.index("--port")


@pytest.mark.model
def test_the_port_opens_first_and_health_says_starting(tmp_path):
    """issue 42, item 2: `/health` answers 503 "starting" with the stage while the engine is
    built, then 200; the start-up log names each active feature."""
    import signal
    import time

    import httpx

    from tests.server_utils import free_port

    port, log = free_port(), tmp_path / "serve.log"
    cmd = ["serve", "--port", str(port), "--kv-cache-gib", "0.1", "--sla-admission", "on",
           "--speculative-config", '{"method": "ngram"}']  # fmt: skip
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tierserve", *cmd], stdout=out, stderr=subprocess.STDOUT
        )
    seen = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
            except httpx.HTTPError:
                assert proc.poll() is None, log.read_text()
                time.sleep(0.02)
                continue
            seen.append((r.status_code, r.json()))
            if r.status_code == 200:
                break
            time.sleep(0.02)
        starting = [body for code, body in seen if code == 503]
        assert seen[-1] == (200, {"status": "ok"}), seen[-3:]
        assert starting and all(b["status"] == "starting" and b["stage"] for b in starting)
        assert {code for code, _ in seen} == {503, 200}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert "speculative decoding: n-gram lookup" in text and "SLA admission: on" in text
    assert "ready in " in text


def test_bench_engine_takes_a_model_of_your_own(tmp_path):
    """issue 42, item 4: "how fast is it on my machine with my model" has a command."""
    from tests.test_architectures import save_tiny

    r = run_cli("bench-engine", "--model", str(tmp_path / "nothing"))
    assert r.returncode == 2 and "--model" in r.stderr.strip().splitlines()[-1]
    save_tiny(tmp_path / "m", "LlamaForCausalLM")
    r = subprocess.run(
        [sys.executable, "-m", "tierserve", "bench-engine", "--model", str(tmp_path / "m"),
         "--concurrency", "1", "--rounds", "1", "--prompt-len", "8", "--output-len", "4",
         "--no-transformers"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("model ")
    assert "tierserve" in r.stdout
