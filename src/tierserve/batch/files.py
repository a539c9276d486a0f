"""File bodies on disk (`--files-dir`), and the validation of a batch input file.

A body is written to a temporary name, flushed and fsynced, then renamed: a crash leaves the
whole file or none. Validation reads the file once, line by line, and names the first bad line
by its number (1-based, as an editor shows it); blank lines are skipped.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tierserve.batch.config import ENDPOINTS

MAX_CUSTOM_ID = 512
LINE_KEYS = {"custom_id", "method", "url", "body"}


class FileFormatError(ValueError):
    """A batch input file is not valid JSONL of requests; names the line."""

    def __init__(self, line: int | None, message: str) -> None:
        super().__init__(f"line {line}: {message}" if line is not None else message)
        self.line = line


class FileTooLarge(ValueError):
    pass


@dataclass(frozen=True)
class InputLine:
    line: int
    custom_id: str
    url: str
    body: dict


@dataclass(frozen=True)
class Checked:
    bytes: int
    lines: int
    urls: frozenset[str]


def _check_line(raw: bytes, n: int, max_line_bytes: int) -> InputLine | None:
    if len(raw) > max_line_bytes:
        raise FileFormatError(n, f"the line is {len(raw)} bytes, more than {max_line_bytes}")
    if not raw.strip():
        return None
    try:
        obj = json.loads(raw)
    except UnicodeDecodeError:
        raise FileFormatError(n, "the line is not valid UTF-8") from None
    except json.JSONDecodeError as exc:
        raise FileFormatError(n, f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise FileFormatError(n, f"expected a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - LINE_KEYS)
    if unknown:
        raise FileFormatError(n, f"unknown field {unknown[0]!r} (a line has {sorted(LINE_KEYS)})")
    missing = sorted(LINE_KEYS - set(obj))
    if missing:
        raise FileFormatError(n, f"missing field {missing[0]!r}")
    cid = obj["custom_id"]
    if not isinstance(cid, str) or not cid or len(cid) > MAX_CUSTOM_ID:
        raise FileFormatError(n, f"custom_id must be a string of 1..{MAX_CUSTOM_ID} characters")
    if obj["method"] != "POST":
        raise FileFormatError(n, f"method must be POST, got {obj['method']!r}")
    if obj["url"] not in ENDPOINTS:
        raise FileFormatError(
            n, f"unsupported url {obj['url']!r}: supported are {', '.join(ENDPOINTS)}"
        )
    if not isinstance(obj["body"], dict):
        raise FileFormatError(n, "body must be a JSON object (the request's body)")
    return InputLine(n, cid, obj["url"], obj["body"])


def iter_lines(src: BinaryIO, max_line_bytes: int) -> Iterator[InputLine]:
    """The requests of a batch input file, checked one by one (FileFormatError)."""
    for n, raw in enumerate(src, start=1):
        line = _check_line(raw, n, max_line_bytes)
        if line is not None:
            yield line


def check_batch_input(src: BinaryIO, max_line_bytes: int, max_lines: int) -> Checked:
    """Validate a whole input file: every line, unique custom_ids, the line limit."""
    seen: dict[str, int] = {}
    urls: set[str] = set()
    for item in iter_lines(src, max_line_bytes):
        first = seen.setdefault(item.custom_id, item.line)
        if first != item.line:
            raise FileFormatError(
                item.line, f"custom_id {item.custom_id!r} is used twice (first on line {first})"
            )
        if len(seen) > max_lines:
            raise FileFormatError(item.line, f"more than {max_lines} requests in one file")
        urls.add(item.url)
    if not seen:
        raise FileFormatError(None, "the file holds no requests")
    return Checked(src.tell(), len(seen), frozenset(urls))


class FileBodies:
    """The bodies of files, by id, in one folder."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder).expanduser()
        self.folder.mkdir(parents=True, exist_ok=True)

    def path(self, name: str) -> Path:
        return self.folder / name

    def save_stream(self, name: str, src: BinaryIO, limit: int) -> int:
        """Copy `src` to `name` (atomically); FileTooLarge past `limit` bytes."""
        tmp = self.path(f".{name}.tmp")
        try:
            with open(tmp, "wb") as out:
                n = 0
                while chunk := src.read(1 << 20):
                    n += len(chunk)
                    if n > limit:
                        raise FileTooLarge(f"the file is larger than {limit} bytes")
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path(name))
            return n
        finally:
            tmp.unlink(missing_ok=True)

    def write_lines(self, name: str, lines: Iterator[str]) -> int:
        """Write `lines` (each a JSON text) to `name`, atomically; returns the bytes."""
        tmp = self.path(f".{name}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as out:
                for line in lines:
                    out.write(line)
                    out.write("\n")
                out.flush()
                os.fsync(out.fileno())
            size = tmp.stat().st_size
            os.replace(tmp, self.path(name))
            return size
        finally:
            tmp.unlink(missing_ok=True)

    def open(self, name: str) -> BinaryIO:
        return open(self.path(name), "rb")

    def read(self, name: str) -> bytes:
        return self.path(name).read_bytes()

    def remove(self, name: str) -> None:
        self.path(name).unlink(missing_ok=True)

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.folder).free
