"""Messages between the server process and the engine process (pickled over two one-way pipes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


# ---- messages (server -> engine) ----
@dataclass(frozen=True)
class GenerateCmd:
    """Start one generation (server -> engine)."""

    rid: str
    kwargs: dict  # Engine.generate keyword arguments for one prompt (no `stream`)


@dataclass(frozen=True)
class AbortCmd:
    """Abort a generation (server -> engine)."""

    rid: str


@dataclass(frozen=True)
class CallCmd:
    """Run one whitelisted engine call (server -> engine)."""

    call_id: int
    method: str  # one of EngineWorker.CALLS
    args: tuple = ()


@dataclass(frozen=True)
class ShutdownCmd:
    """Stop the engine process (server -> engine)."""


# ---- messages (engine -> server) ----
@dataclass(frozen=True)
class Ready:
    """The model is loaded; `info` describes it (engine -> server)."""

    info: dict


@dataclass(frozen=True)
class StartupFailed:
    """The engine could not be built (engine -> server)."""

    message: str


@dataclass(frozen=True)
class Chunk:
    """A cumulative output of one generation (engine -> server)."""

    rid: str
    data: dict  # cumulative SGLang /generate object


@dataclass(frozen=True)
class Done:
    """The generation ended after its last chunk (engine -> server)."""

    rid: str


@dataclass(frozen=True)
class Failed:
    """The generation was rejected or failed (engine -> server)."""

    rid: str
    message: str
    status: int  # 400: the request was bad; 500: the engine failed on it; 503: engine gone


@dataclass(frozen=True)
class CallResult:
    """The answer to a CallCmd (engine -> server)."""

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
