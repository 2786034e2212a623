"""ProgramState (what a program body receives and `run` returns) and ProgramStateGroup (forks)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Iterator, Optional

from .program_trace import JoinEvent, ProgramTrace, build_trace
from .nodes import (
    SglCommitLazy,
    SglConstantText,
    SglExpr,
    SglExprList,
    SglRoleBegin,
    SglRoleEnd,
    SglVarScopeBegin,
    SglVarScopeEnd,
)

if TYPE_CHECKING:
    from .interpreter import StreamExecutor


class ProgramError(RuntimeError):
    """A program failed in its worker; raised where the caller reads its results."""


class ProgramState:
    """The state `s` of a running program: append with `+=`, read variables with `s[name]`."""

    def __init__(self, stream_executor: StreamExecutor):
        self.stream_executor = stream_executor
        self.ret_value: Any = None
        self.body_done = threading.Event()
        self.body_done.set()

    # ------------------------------------------------------------ building

    def __iadd__(self, other: Any) -> "ProgramState":
        if other is None:
            raise ValueError("cannot append None to a program state")
        self.stream_executor.submit(other)
        return self

    def _role(self, role: str, expr: Any = None):
        if expr is None:
            return self._role_scope(role)
        self.stream_executor.submit(SglExprList([SglRoleBegin(role), expr, SglRoleEnd(role)]))
        return None

    @contextlib.contextmanager
    def _role_scope(self, role: str):
        self.stream_executor.submit(SglRoleBegin(role))
        yield
        self.stream_executor.submit(SglRoleEnd(role))

    def system(self, expr: Any = None):
        """Submit a system block, or (no argument) return a `with` context for one."""
        return self._role("system", expr)

    def user(self, expr: Any = None):
        """Submit a user block, or (no argument) return a `with` context for one."""
        return self._role("user", expr)

    def assistant(self, expr: Any = None):
        """Submit an assistant block, or (no argument) return a `with` context for one."""
        return self._role("assistant", expr)

    @contextlib.contextmanager
    def var_scope(self, name: str):
        """Everything appended inside the block becomes the text value of variable `name`."""
        self.stream_executor.submit(SglVarScopeBegin(name))
        yield
        self.stream_executor.submit(SglVarScopeEnd(name))

    def fork(self, size: int = 1, position_ids_offset: Optional[list] = None) -> "ProgramStateGroup":
        """`size` child states sharing this text; with size > 1 the shared prefix is cached first."""
        if size < 1:
            raise ValueError(f"fork size must be >= 1, got {size}")
        if size > 1:
            self.stream_executor.submit(SglCommitLazy())
        children = self.stream_executor.fork(size)
        return ProgramStateGroup([ProgramState(c) for c in children], self)

    @contextlib.contextmanager
    def copy(self):
        """A single fork that is joined back (variables gathered) when the block exits."""
        group = self.fork(1)
        yield group[0]
        group.join()

    # ------------------------------------------------------------ reading

    def __getitem__(self, name: str) -> Any:
        return self.stream_executor.get_var(name)

    get_var = __getitem__

    def __setitem__(self, name: str, value: Any) -> None:
        self.stream_executor.set_var(name, value)

    set_var = __setitem__

    def __contains__(self, name: str) -> bool:
        """Whether `name` is set or pending (submitted but not generated yet); never waits."""
        ex = self.stream_executor
        return name in ex.variables or name in ex.variable_event

    def sync(self) -> None:
        """Wait until the program body has returned and every submitted expression has run."""
        self.body_done.wait()
        self.stream_executor.sync()

    def text(self) -> str:
        """The full text so far (role prefixes/suffixes included), after a sync."""
        self.sync()
        return self.stream_executor.text_

    def messages(self) -> list[dict]:
        """OpenAI-style messages of every ended role block, after a sync."""
        self.sync()
        return list(self.stream_executor.messages_)

    def error(self) -> Optional[BaseException]:
        """The exception the program raised (body or worker), or None, after a sync."""
        self.sync()
        return self.stream_executor.error_

    def trace(self) -> ProgramTrace:
        """What the program ran, after a sync: gens (tokens by origin), selects (choice scores), roles, forks and
        joins with their branches, and timing; `.to_html(path)` writes a page (sglpy/program_trace.py)."""
        self.sync()
        return build_trace(self.stream_executor)

    def get_meta_info(self, name: str, timeout: Optional[float] = None) -> Any:
        """The runtime's meta_info for gen `name` (the ChoicesDecision meta for a select)."""
        self.stream_executor.get_var(name, timeout)
        return self.stream_executor.meta_info.get(name)

    def _raise_if_failed(self) -> None:
        err = self.stream_executor.error_
        if err is not None:
            raise ProgramError(f"the program failed with {type(err).__name__}: {err}") from err

    def text_iter(self, var_name: Optional[str] = None) -> Iterator[str]:
        """Text deltas as they are generated (whole text, or one variable); one piece if not streaming."""
        ex = self.stream_executor
        if not ex.stream:
            yield self.text() if var_name is None else self[var_name]
            return
        pos = 0
        while True:
            with ex.cond:
                while True:
                    if var_name is None:
                        source, done = ex.text_, ex.is_finished or ex.error_ is not None
                    else:
                        source = ex.stream_buffers.get(var_name, "")
                        ev = ex.variable_event.get(var_name)
                        done = (ev is not None and ev.is_set() and var_name in ex.variables) \
                            or ex.is_finished or ex.error_ is not None
                        if done and isinstance(ex.variables.get(var_name), str):
                            source = ex.variables[var_name]  # var_scope values are not streamed piecewise
                    if len(source) > pos or done:
                        break
                    ex.cond.wait(0.5)
                chunk, pos = source[pos:], len(source)
            if chunk:
                yield chunk
            if done and pos >= len(source):
                self._raise_if_failed()
                if var_name is not None and var_name not in ex.variables:
                    raise KeyError(f"variable {var_name!r} was never set by this program")
                return

    async def text_async_iter(self, var_name: Optional[str] = None,
                              return_meta_data: bool = False) -> AsyncIterator[Any]:
        """Async version of text_iter; with return_meta_data yields (chunk, meta_info) pairs."""
        it = self.text_iter(var_name)
        sentinel = object()
        while True:
            chunk = await asyncio.to_thread(next, it, sentinel)
            if chunk is sentinel:
                return
            if return_meta_data:
                meta = self.stream_executor.meta_info.get(var_name) if var_name else None
                yield chunk, meta
            else:
                yield chunk

    def __repr__(self):
        return f"ProgramState({self.text()!r})"


class ProgramStateGroup:
    """The states returned by `fork(n)`: index them, `forks += ...`, then `join()`."""

    def __init__(self, states: list[ProgramState], parent: ProgramState):
        self.states = states
        self.parent = parent

    def __getitem__(self, i: int) -> ProgramState:
        return self.states[i]

    def __setitem__(self, i: int, state: ProgramState) -> None:
        # `forks[i] += expr` rebinds the item to the same state after __iadd__.
        if state is not self.states[i]:
            raise TypeError("fork branches cannot be replaced; use forks[i] += expr")

    def __len__(self) -> int:
        return len(self.states)

    def __iter__(self):
        return iter(self.states)

    def __iadd__(self, other: Any) -> "ProgramStateGroup":
        if callable(other) and not isinstance(other, SglExpr):
            for i, s in enumerate(self.states):
                s += other(i)
        elif isinstance(other, (list, tuple)):
            if len(other) != len(self.states):
                raise ValueError(f"{len(other)} expressions for {len(self.states)} forks")
            for s, e in zip(self.states, other):
                s += e
        else:
            for s in self.states:
                s += other
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """Wait for every branch; gather new variables into the parent as lists, and in
        `concate_and_append` mode also append each branch's new text to the parent, in order."""
        if mode not in ("gather_variable", "concate_and_append"):
            raise ValueError(f"unknown join mode {mode!r}: use 'gather_variable' or 'concate_and_append'")
        parent_ex = self.parent.stream_executor
        for s in self.states:
            s.stream_executor.sync()
        for s in self.states:
            err = s.stream_executor.error_
            if err is not None:
                parent_ex.fail(err)
                raise ProgramError(f"a forked branch failed with {type(err).__name__}: {err}") from err
        parent_ex.sync()
        before = set(parent_ex.variables)
        names: list[str] = []
        for s in self.states:
            for name in s.stream_executor.variables:
                if name not in before and name not in names:
                    names.append(name)
        for name in names:
            parent_ex.set_var(name, [s.stream_executor.variables.get(name) for s in self.states])
            parent_ex.meta_info[name] = [s.stream_executor.meta_info.get(name) for s in self.states]
        parent_ex.events.append(JoinEvent(time.perf_counter(), mode, tuple(s.stream_executor for s in self.states)))
        if mode == "concate_and_append":
            new_text = "".join(s.stream_executor.text_[s.stream_executor.fork_start_text_pos:] for s in self.states)
            parent_ex.submit(SglConstantText(new_text))
        for s in self.states:
            s.stream_executor.end()
