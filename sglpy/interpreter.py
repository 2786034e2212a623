"""Program execution: one StreamExecutor (worker thread + FIFO of IR nodes) per ProgramState."""

from __future__ import annotations

import queue
import threading
import time
import uuid
import warnings
from typing import Any, Optional

from .backend_base import BaseBackend
from .chat_template import ChatTemplate
from .program_state import ProgramError, ProgramState, ProgramStateGroup  # noqa: F401 - SGLang's interpreter names
from .program_trace import ForkEvent
from .nodes import (
    GenParams,
    SglCommitLazy,
    SglConstantText,
    SglExpr,
    SglGen,
    SglImage,
    SglRoleBegin,
    SglRoleEnd,
    SglSelect,
    SglSeparateReasoning,
    SglVarScopeBegin,
    SglVarScopeEnd,
    reasoning_name,
    wrap,
)
from .separate_reasoning import model_type_of, separate
from .spec_exec import SpecTerm, check_speculable, run_spec_turn, speculable_completion_gen, speculated_gen


_END = object()


def role_begin_text(template: ChatTemplate, role: str, first_message: bool) -> str:
    """Text written when a role block opens (the template's default system block comes first if due)."""
    text = ""
    if first_message and role != "system" and template.default_system_prompt is not None:
        sp, ss = template.get_prefix_and_suffix("system")
        text = sp + template.default_system_prompt + ss
    return text + template.get_prefix_and_suffix(role)[0]


class StreamExecutor:
    """Runs submitted IR nodes in order on its own thread; keeps text, messages and variables."""

    def __init__(self, backend: BaseBackend, default_sampling: GenParams,
                 chat_template: Optional[ChatTemplate] = None, stream: bool = False,
                 num_api_spec_tokens: Optional[int] = None):
        self.sid = uuid.uuid4().hex
        # API speculative execution (sglpy/spec_exec.py) applies to hosted-API backends only.
        self.num_api_spec_tokens = num_api_spec_tokens if backend.supports_api_spec else None
        self.spec_chat = self.num_api_spec_tokens is not None and backend.is_chat_model
        self.spec_text = ""  # completion models: text speculated by an earlier call, not yet used
        self.spec_turn: Optional[list[SpecTerm]] = None  # chat models: the open assistant turn's recorded pieces
        self._caller_role: Optional[str] = None
        self._deferred: set[str] = set()  # variables of a speculative turn the caller has not closed yet
        self.backend = backend
        self.default_sampling = default_sampling
        self.chat_template = chat_template or backend.get_chat_template()
        self.stream = stream
        self.text_ = ""
        self.messages_: list[dict] = []
        self.images_: list[bytes] = []  # sgl.image's images in prompt order (encoded bytes), sent with every call
        self.variables: dict[str, Any] = {}
        self.meta_info: dict[str, Any] = {}
        self.variable_event: dict[str, threading.Event] = {}
        self.stream_buffers: dict[str, str] = {}
        self.cur_role: Optional[str] = None
        self.cur_role_begin_pos = 0
        self.var_scope_begin: dict[str, int] = {}
        self.var_spans: dict[str, tuple[int, int]] = {}  # a gen/select's output in text_ (separate_reasoning)
        self.separating: set[str] = set()  # variables whose event waits for their separate_reasoning
        self.fork_start_text_pos = 0
        self.error_: Optional[BaseException] = None
        self.is_finished = False
        self.children: list["StreamExecutor"] = []
        self.events: list = []  # what the worker ran, forks and joins: state.trace() (program_trace.py)
        self._ended = False
        self.cond = threading.Condition()
        self.queue: "queue.Queue" = queue.Queue()
        self.worker = threading.Thread(target=self._loop, name=f"sglpy-state-{self.sid[:8]}", daemon=True)
        self.worker.start()

    # ------------------------------------------------------------ caller side

    def submit(self, expr: Any) -> None:
        """Queue an expression; named outputs get a fresh event so readers wait for this value."""
        if self._ended:
            raise RuntimeError("cannot append to a program state that has finished")
        nodes = wrap(expr).flatten()
        for node in nodes:
            name = getattr(node, "name", None)
            if isinstance(node, (SglGen, SglSelect, SglVarScopeEnd)) and name is not None:
                self.variable_event[name] = threading.Event()
            if isinstance(node, SglSeparateReasoning):  # the targets are ready once split (not when generated)
                if not self.stream:
                    model_type_of(self, node)  # no parser known: the caller's error, now
                    self.separating.update(node.targets)
                for target in node.targets:
                    self.variable_event[reasoning_name(target)] = threading.Event()
            if isinstance(node, SglRoleBegin):
                self._caller_role = node.role
            elif isinstance(node, SglRoleEnd):
                self._caller_role = None
                self._deferred.clear()
            elif self.spec_chat and isinstance(node, SglGen) and name is not None and self._caller_role == "assistant":
                self._deferred.add(name)
        for node in nodes:
            self.queue.put(node)

    def sync(self) -> None:
        """Wait until every submitted node has run."""
        self.queue.join()

    def end(self) -> None:
        """No more input: the worker (and any un-joined fork's worker) exits after draining its queue."""
        if self._ended:
            return
        self._ended = True
        for c in self.children:
            c.end()
        self.queue.put(_END)

    def get_var(self, name: str, timeout: Optional[float] = None) -> Any:
        """The value of `name`, waiting for it; a clear error if it failed or was never set."""
        if name in self._deferred:  # reading it here would wait for a turn end the caller never submits
            raise RuntimeError(f"variable {name!r} is set when its assistant turn closes (speculative execution, "
                               "num_api_spec_tokens): read it after the sgl.assistant block")
        event = self.variable_event.get(name)
        if event is None:
            if name not in self.variables:
                self.sync()
        elif not event.wait(timeout):
            raise TimeoutError(f"variable {name!r} not ready after {timeout}s")
        if name in self.variables:
            return self.variables[name]
        if self.error_ is not None:
            raise ProgramError(f"variable {name!r} was not produced: the program failed with "
                               f"{type(self.error_).__name__}: {self.error_}") from self.error_
        raise KeyError(f"variable {name!r} was never set by this program; set variables: {sorted(self.variables)}")

    def set_var(self, name: str, value: Any) -> None:
        """Set a variable directly (host code, joins)."""
        with self.cond:
            self.variables[name] = value
            self.cond.notify_all()
        self.variable_event.setdefault(name, threading.Event()).set()

    def fork(self, size: int) -> list["StreamExecutor"]:
        """Child executors that copy this state's text, messages, role and variables (after a sync)."""
        self.sync()
        children = []
        for _ in range(size):
            c = StreamExecutor(self.backend, self.default_sampling, self.chat_template, self.stream,
                               self.num_api_spec_tokens)
            c.text_ = self.text_
            c.messages_ = list(self.messages_)
            c.images_ = list(self.images_)
            c.variables = dict(self.variables)
            c.meta_info = dict(self.meta_info)
            for k in c.variables:
                c.variable_event[k] = _set_event()
            c.cur_role, c.cur_role_begin_pos = self.cur_role, self.cur_role_begin_pos
            c.var_scope_begin = dict(self.var_scope_begin)
            c.fork_start_text_pos = len(self.text_)
            children.append(c)
        self.children.extend(children)
        self.events.append(ForkEvent(time.perf_counter(), tuple(children)))
        return children

    def fail(self, exc: BaseException) -> None:
        """Record an error raised outside the worker (e.g. in a streaming program body)."""
        with self.cond:
            if self.error_ is None:
                self.error_ = exc
            self.cond.notify_all()
        self._release_waiters()

    # ------------------------------------------------------------ worker side

    def _loop(self) -> None:
        while True:
            node = self.queue.get()
            try:
                if node is _END:
                    with self.cond:
                        self.is_finished = True
                        self.cond.notify_all()
                    self._release_waiters()
                    return
                if self.error_ is None:
                    t0, pos, role = time.perf_counter(), len(self.text_), self.cur_role
                    self._execute(node)
                    self.events.append((node, t0, time.perf_counter(), pos, len(self.text_), role))
            except BaseException as e:  # noqa: BLE001 - reported to the reader, never lost
                warnings.warn(f"sglpy program error: {type(e).__name__}: {e}", RuntimeWarning, stacklevel=1)
                self.fail(e)
            finally:
                # After an error the remaining nodes are skipped (later text would build on a broken state);
                # waiters registered after the failure are released as their nodes are skipped.
                if self.error_ is not None:
                    self._release_waiters()
                self.queue.task_done()

    def _release_waiters(self) -> None:
        for ev in list(self.variable_event.values()):
            ev.set()

    def _append(self, text: str, var: Optional[str] = None, speculated: bool = False) -> None:
        if self.spec_text and not speculated:  # text the program adds must be what was speculated, else drop it
            self.spec_text = self.spec_text[len(text):] if self.spec_text.startswith(text) else ""
        with self.cond:
            self.text_ += text
            if var is not None:
                self.stream_buffers[var] = self.stream_buffers.get(var, "") + text
            self.cond.notify_all()

    def _append_output(self, text: str, var: Optional[str]) -> None:
        """A gen's or select's whole output, its span in the text remembered."""
        start = len(self.text_)
        self._append(text, var)
        if var is not None:
            self.var_spans[var] = (start, start + len(text))

    def _reset_buffer(self, name: Optional[str]) -> None:
        if name is not None:
            with self.cond:
                self.stream_buffers[name] = ""

    def _finish_var(self, name: Optional[str], value: Any, meta: Any) -> None:
        if name is None:
            return
        with self.cond:
            self.variables[name] = value
            self.meta_info[name] = meta
            self.cond.notify_all()
        if name not in self.separating:
            self.variable_event.setdefault(name, threading.Event()).set()

    def _execute(self, node: SglExpr) -> None:
        if self.spec_turn is not None and not isinstance(node, (SglConstantText, SglGen, SglRoleEnd)):
            raise ValueError(f"speculative execution (num_api_spec_tokens): {type(node).__name__} inside an assistant "
                             "turn of a chat model is not supported (only text and gens)")
        if isinstance(node, SglConstantText) and self.spec_turn is not None:
            self.spec_turn.append(SpecTerm(node.value))
        elif isinstance(node, SglConstantText):
            self._append(node.value)
        elif isinstance(node, SglGen):
            self._execute_gen(node)
        elif isinstance(node, SglSelect):
            if self.backend.is_chat_model:
                messages, partial = self._chat_context("select")
                decision = self.backend.select_chat(messages, partial, node.choices, node.temperature,
                                                    node.choices_method)
            else:
                decision = self.backend.select(self.text_, node.choices, node.temperature, node.choices_method,
                                               **self._images())
            self._reset_buffer(node.name)
            self._append_output(decision.decision, node.name)
            self._finish_var(node.name, decision.decision, decision.meta_info)
        elif isinstance(node, SglRoleBegin):
            if self.cur_role is not None:
                raise ValueError(f"Nested roles are not allowed: {node.role!r} opened inside {self.cur_role!r}")
            self._append(role_begin_text(self.chat_template, node.role, not self.messages_))
            self.cur_role, self.cur_role_begin_pos = node.role, len(self.text_)
            if self.spec_chat and node.role == "assistant":
                self.spec_turn = []
        elif isinstance(node, SglRoleEnd):
            if self.cur_role != node.role:
                raise ValueError(f"role end {node.role!r} does not match the open role {self.cur_role!r}")
            if self.spec_turn is not None:
                run_spec_turn(self)
            content = self.text_[self.cur_role_begin_pos:]
            self._append(self.chat_template.get_prefix_and_suffix(node.role)[1])
            self.messages_.append({"role": node.role, "content": content.lstrip()})
            self.cur_role = None
        elif isinstance(node, SglVarScopeBegin):
            self.var_scope_begin[node.name] = len(self.text_)
        elif isinstance(node, SglVarScopeEnd):
            if node.name not in self.var_scope_begin:
                raise ValueError(f"var_scope {node.name!r} ended without beginning")
            value = self.text_[self.var_scope_begin.pop(node.name):]
            self._finish_var(node.name, value, None)
        elif isinstance(node, SglCommitLazy):
            if self.text_:
                self.backend.cache_prefix(self.text_, **self._images())
        elif isinstance(node, SglSeparateReasoning):
            separate(self, node)
        elif isinstance(node, SglImage):
            placeholder = self.backend.image_placeholder()  # a backend or model without images says so here
            from sglpy.runtime.images import ImageLimits, image_bytes

            self.images_.append(image_bytes(node.source, ImageLimits(allow_paths=True)))  # the program's own files
            self._append(placeholder)
        else:
            raise TypeError(f"unknown program node {type(node).__name__}")

    def _images(self) -> dict:
        """The images keyword of a backend call: only when the program has images (other backends never see it)."""
        return {"images": tuple(self.images_)} if self.images_ else {}

    def _chat_context(self, what: str) -> tuple[list[dict], str]:
        """(finished messages, the open assistant turn's text so far) for a chat-model backend."""
        if self.cur_role != "assistant":
            raise ValueError(f"{type(self.backend).__name__} serves a chat model: a {what} must be inside an "
                             f"assistant turn (sgl.assistant(...)), not in {self.cur_role or 'plain text'}")
        return list(self.messages_), self.text_[self.cur_role_begin_pos:].lstrip()

    def _execute_gen(self, node: SglGen) -> None:
        params = self.default_sampling.resolve(node.overrides, self.chat_template.stop_str)  # dtype lowered
        self._reset_buffer(node.name)
        n = params.sampling.n
        if self.num_api_spec_tokens is not None and self.stream:
            raise ValueError("stream=True is not supported with speculative execution (num_api_spec_tokens)")
        if self.spec_turn is not None:  # chat model, speculative turn: filled when the turn closes
            check_speculable(params, "in an assistant turn")
            self.spec_turn.append(SpecTerm(name=node.name, params=params))
            return
        chat = self.backend.is_chat_model
        if self.stream and n == 1:
            meta: dict = {}
            if chat:
                messages, partial = self._chat_context("gen")
                chunks = self.backend.generate_chat_stream(messages, params, partial)
            else:
                chunks = self.backend.generate_stream(self.text_, params, **self._images())
            for chunk in chunks:
                self._append(chunk.delta, node.name)
                meta = chunk.meta_info
            value = self.stream_buffers.get(node.name, "") if node.name is not None else None
            self._finish_var(node.name, _tool_value(node, value), meta)
            return
        if self.num_api_spec_tokens is not None and not chat and speculable_completion_gen(params):
            if speculated_gen(self, node, params):
                return
        if chat:
            messages, partial = self._chat_context("gen")
            res = self.backend.generate_chat(messages, params, partial)
        else:
            res = self.backend.generate(self.text_, params, **self._images())
        self.spec_text = ""
        self._append_output(res.text, node.name)
        value = list(res.texts) if n > 1 else res.text
        self._finish_var(node.name, _tool_value(node, value), res.meta_info)


def _tool_value(node: SglGen, value: Any) -> Any:
    """A tool gen's variable is its parsed calls (sglpy.tools.ToolResult); other gens keep their text."""
    if node.tool_request is None or value is None:
        return value
    from .tools import parse_result

    return parse_result(value)


def _set_event() -> threading.Event:
    ev = threading.Event()
    ev.set()
    return ev
