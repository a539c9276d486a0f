"""`--model` before anything loads: a path that cannot be a model is one clear line (exit 2),
and the name clients use in `model` follows one rule.

**The served name** (without `--served-model-name`): the embedded model is
`SmolLM2-135M-Instruct`; a GGUF file is its file name without `.gguf` and without a
llama.cpp quantization tag (`.Q4_1`, `-Q8_0`, `.F16`, `-IQ4_XS`, ...); a Hugging Face folder
is the folder's name. So the embedded GGUF given by path serves under the same name as the
default. Torch-free, but for `check_device`, which asks torch what it was built with.
"""

from __future__ import annotations

import re
from pathlib import Path

EMBEDDED_NAME = "SmolLM2-135M-Instruct"  # as model/loader.py's DEFAULT_MODEL_NAME
# llama.cpp's file-name tags for a quantization or a float type, at the end of the stem.
_QUANT_TAG = re.compile(
    r"[.-](?:I?Q\d+(?:_[A-Z0-9]+)*|F16|F32|BF16|FP16|FP32)$",
    re.IGNORECASE,
)


def served_name(model: str | None) -> str:
    if model is None:
        return EMBEDDED_NAME
    path = Path(model).expanduser()
    if path.suffix.lower() == ".gguf":
        return _QUANT_TAG.sub("", path.stem) or path.stem
    return path.name or str(model)


def check_tokenizer_source(tokenizer: str | None) -> None:
    """ValueError naming what is wrong with `--tokenizer`."""
    if tokenizer is None:
        return
    path = Path(tokenizer).expanduser()
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return
    if path.is_file() and (path.name == "tokenizer.json" or path.suffix.lower() == ".gguf"):
        return
    raise ValueError(
        f"--tokenizer {tokenizer}: give a folder with tokenizer.json, a tokenizer.json file or "
        "a .gguf file"
    )


def check_model_source(model: str | None, tokenizer: str | None = None) -> None:
    """ValueError naming what is wrong with `--model` (and `--tokenizer`), checked without
    loading anything."""
    check_tokenizer_source(tokenizer)
    if model is None:
        return
    path = Path(model).expanduser()
    if not path.exists():
        raise ValueError(
            f"--model {model}: no such file or folder (give a .gguf file or a Hugging Face "
            "model folder; nothing is downloaded)"
        )
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(
                f"--model {model}: not a Hugging Face model folder (it has no config.json)"
            )
        if not any(path.glob("*.safetensors")):
            raise ValueError(f"--model {model}: the folder has no *.safetensors weight files")
        if tokenizer is None and not (path / "tokenizer.json").is_file():
            raise ValueError(
                f"--model {model}: the folder has no tokenizer.json; give --tokenizer PATH (a "
                "folder with tokenizer.json, that file, or the GGUF file of the same model)"
            )
        return
    if path.suffix.lower() != ".gguf":
        raise ValueError(f"--model {model}: not a GGUF file (expected a .gguf file or a folder)")
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"--model {model}: not a GGUF file (it does not start with GGUF)")


def check_device(device: str | None) -> None:
    """`--device cuda` where this torch cannot reach a GPU: one line naming the fix."""
    if device is None or not str(device).startswith("cuda"):
        return
    import torch

    if torch.version.cuda is None:
        raise ValueError(
            f"--device {device}: this torch ({torch.__version__}) was built without CUDA; "
            "install a CUDA build of torch (README: On a GPU) or use --device cpu"
        )
    if not torch.cuda.is_available():
        raise ValueError(
            f"--device {device}: torch {torch.__version__} sees no CUDA device (driver, "
            "CUDA_VISIBLE_DEVICES?); use --device cpu to serve on the CPU"
        )
