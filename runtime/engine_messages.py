"""Messages between the server process and the engine process (pickled over two one-way pipes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


# ---- messages (server -> engine) ----
@dataclass(frozen=True)
class GenerateCmd:
    rid: str
    kwargs: dict  # Engine.generate keyword arguments for one prompt (no `stream`)


@dataclass(frozen=True)
class AbortCmd:
    rid: str


@dataclass(frozen=True)
class CallCmd:
    call_id: int
    method: str  # one of EngineWorker.CALLS
    args: tuple = ()


@dataclass(frozen=True)
class ShutdownCmd:
    pass


# ---- messages (engine -> server) ----
@dataclass(frozen=True)
class Ready:
    info: dict


@dataclass(frozen=True)
class StartupFailed:
    message: str


@dataclass(frozen=True)
class Chunk:
    rid: str
    data: dict  # cumulative SGLang /generate object


@dataclass(frozen=True)
class Done:
    rid: str


@dataclass(frozen=True)
class Failed:
    rid: str
    message: str
    status: int  # 400: the request was bad; 500: the engine failed on it; 503: engine gone


@dataclass(frozen=True)
class CallResult:
    call_id: int
    value: Any = None
    error: str | None = None
    status: int = 200


class EngineError(Exception):
    """A request the engine rejected or could not finish; `status` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message
