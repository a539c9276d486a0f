"""Commands from the event loop to the engine thread: frozen dataclasses, sent through
``AsyncEngine``'s queue and carried out between steps (``AsyncEngine._carry_out`` matches on
them). None holds a live engine object: ``Add`` carries the frozen request and the stream its
deltas go to; the others name a request by id or a class."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tierserve.engine.events import ErrorKind
from tierserve.priority import Priority

if TYPE_CHECKING:
    from tierserve.engine.streams import LocalStream


@dataclass(frozen=True, slots=True)
class Add:
    stream: LocalStream  # its .request is the frozen EngineRequest


@dataclass(frozen=True, slots=True)
class Abort:
    request_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Fail:
    request_id: str
    kind: ErrorKind
    reason: str


@dataclass(frozen=True, slots=True)
class Shed:
    below: Priority  # shed among the classes less urgent than this one
    reason: str


Command = Add | Abort | Fail | Shed
