"""Tracing: run a program body against placeholders to get its graph and its constant prefix."""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

from .chat_template import ChatTemplate
from .interpreter import role_begin_text
from .nodes import (
    SglArgument,
    SglConstantText,
    SglExpr,
    SglExprList,
    SglFork,
    SglGen,
    SglRoleBegin,
    SglRoleEnd,
    SglSelect,
    SglVarScopeBegin,
    SglVarScopeEnd,
    wrap,
)


class StopTracing(Exception):
    """Raised inside a traced body once the constant prefix has ended."""


class SglVariable(SglArgument):
    """Placeholder for a variable read during tracing (its value is unknown until run time)."""

    def __repr__(self):
        return f"SglVariable({self.name!r})"


def _describe(node: SglExpr) -> str:
    if isinstance(node, SglConstantText):
        return f"text {node.value!r}"
    if isinstance(node, SglGen):
        return f"gen {node.name!r} {({k: v for k, v in node.overrides.items() if v is not None})}"
    if isinstance(node, SglSelect):
        return f"select {node.name!r} choices={node.choices!r}"
    if isinstance(node, SglRoleBegin):
        return f"{node.role}_begin"
    if isinstance(node, SglRoleEnd):
        return f"{node.role}_end"
    if isinstance(node, SglVarScopeBegin):
        return f"var_scope_begin {node.name!r}"
    if isinstance(node, SglVarScopeEnd):
        return f"var_scope_end {node.name!r}"
    if isinstance(node, SglFork):
        return f"fork {node.size}"
    if isinstance(node, SglArgument):
        return repr(node)
    return type(node).__name__


@dataclass
class TracedProgram:
    """A program graph: nodes in order; each fork node's branches are traced programs of their own."""

    nodes: list = field(default_factory=list)
    branches: dict = field(default_factory=dict)  # index of an SglFork node -> list[TracedProgram]
    reads: list = field(default_factory=list)  # variable names the body read (data dependencies)

    def lines(self, indent: int = 0) -> list[str]:
        """A readable listing of the graph, one node per line, branches indented."""
        out = []
        for i, node in enumerate(self.nodes):
            out.append("  " * indent + _describe(node))
            for j, br in enumerate(self.branches.get(i, [])):
                out.append("  " * (indent + 1) + f"branch {j}:")
                out.extend(br.lines(indent + 2))
        return out

    def print_graph(self) -> None:
        """Print the graph listing."""
        print("\n".join(self.lines()))

    def __str__(self):
        return "\n".join(self.lines())


class TracerProgramState:
    """Stands in for ProgramState while tracing: records nodes instead of executing them."""

    def __init__(self, graph: TracedProgram, only_prefix: bool = False):
        self.graph = graph
        self.only_prefix = only_prefix

    def _record(self, expr: Any) -> None:
        for node in wrap(expr).flatten():
            if self.only_prefix and not isinstance(node, (SglConstantText, SglRoleBegin, SglRoleEnd)):
                raise StopTracing()
            self.graph.nodes.append(node)

    def __iadd__(self, other):
        self._record(other)
        return self

    def _role(self, role, expr=None):
        if expr is None:
            return self._role_scope(role)
        self._record(SglExprList([SglRoleBegin(role), expr, SglRoleEnd(role)]))
        return None

    @contextlib.contextmanager
    def _role_scope(self, role):
        self._record(SglRoleBegin(role))
        yield
        self._record(SglRoleEnd(role))

    def system(self, expr=None):
        return self._role("system", expr)

    def user(self, expr=None):
        return self._role("user", expr)

    def assistant(self, expr=None):
        return self._role("assistant", expr)

    @contextlib.contextmanager
    def var_scope(self, name):
        self._record(SglVarScopeBegin(name))
        yield
        self._record(SglVarScopeEnd(name))

    def __getitem__(self, name):
        if self.only_prefix:
            raise StopTracing()
        self.graph.reads.append(name)
        return SglVariable(name)

    get_var = __getitem__

    def __setitem__(self, name, value):
        pass

    def fork(self, size=1, position_ids_offset=None):
        if self.only_prefix:
            raise StopTracing()
        self.graph.nodes.append(SglFork(size))
        branches = [TracedProgram() for _ in range(size)]
        self.graph.branches[len(self.graph.nodes) - 1] = branches
        return _TracerGroup([TracerProgramState(b) for b in branches])

    @contextlib.contextmanager
    def copy(self):
        group = self.fork(1)
        yield group[0]

    def sync(self):
        pass

    def text(self):
        raise StopTracing() if self.only_prefix else TypeError("s.text() has no value while tracing")


class _TracerGroup(list):
    def __iadd__(self, other):
        for i, s in enumerate(self):
            s += other(i) if callable(other) and not isinstance(other, SglExpr) else (
                other[i] if isinstance(other, (list, tuple)) else other)
        return self

    def join(self, mode="gather_variable"):
        pass


def trace_program(func: Callable, arguments: dict, only_prefix: bool = False) -> TracedProgram:
    """Run `func(s, **arguments)` with placeholders for missing arguments; return the recorded graph."""
    graph = TracedProgram()
    params = list(inspect.signature(func).parameters.values())[1:]
    kwargs = {}
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        kwargs[p.name] = arguments.get(p.name, SglArgument(p.name))
    try:
        func(TracerProgramState(graph, only_prefix), **kwargs)
    except StopTracing:
        pass
    except Exception:
        # Prefix extraction is best effort (the body may need real values); a full trace reports it.
        if not only_prefix:
            raise
    return graph


def constant_prefix(graph: TracedProgram, template: ChatTemplate) -> str:
    """The text a program always starts with: constants and role markup up to the first dynamic node."""
    out, first_message, in_role = [], True, None
    for node in graph.nodes:
        if isinstance(node, SglConstantText):
            out.append(node.value)
        elif isinstance(node, SglRoleBegin):
            out.append(role_begin_text(template, node.role, first_message))
            in_role = node.role
        elif isinstance(node, SglRoleEnd):
            out.append(template.get_prefix_and_suffix(node.role)[1])
            first_message, in_role = False, None
        else:
            break
    return "".join(out)


def extract_prefix_by_tracing(func: Callable, template: ChatTemplate) -> str:
    """The constant prefix of a program traced without arguments."""
    return constant_prefix(trace_program(func, {}, only_prefix=True), template)
