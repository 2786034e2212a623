"""What a program did: `state.trace()` -> ProgramTrace, a tree of the nodes it ran, with timing and token origins.

Each StreamExecutor records what its worker ran (`executor.events`: the node, its start and end, where its text
begins, the role open before it) and its forks and joins; `build_trace` turns those records into TraceNodes.
Gens carry their tokens by origin as far as the backend reports them in meta_info (prompt: cached / prefilled;
output: sampled / jump_forward), selects carry every choice's score. `to_html(path)` writes one self-contained page.
"""

from __future__ import annotations

import json
import pathlib
import time
from dataclasses import dataclass, field
from typing import Any

from . import trace_html as th


@dataclass(frozen=True)
class ForkEvent:
    """A fork(size) of an executor: its child executors (recorded by StreamExecutor.fork)."""

    t: float
    children: tuple


@dataclass(frozen=True)
class JoinEvent:
    """A join of forked branches into their parent (recorded by ProgramStateGroup.join)."""

    t: float
    mode: str
    children: tuple


@dataclass
class TraceNode:
    """One executed node: kind (text, gen, select, role_begin, role_end, var_scope, commit, fork, join), its
    variable name, the role it ran in, its start and end (seconds from the program's start), its text and details."""

    kind: str
    name: str | None = None
    role: str | None = None
    start: float = 0.0
    end: float = 0.0
    text: str = ""
    detail: dict = field(default_factory=dict)
    branches: list["ProgramTrace"] = field(default_factory=list)  # fork / join: one trace per branch

    def to_json(self) -> dict:
        """A JSON-ready dict (branches nested)."""
        out = {"kind": self.kind, "name": self.name, "role": self.role, "start": round(self.start, 6),
               "end": round(self.end, 6), "text": self.text, "detail": self.detail}
        if self.branches:
            out["branches"] = [b.to_json() for b in self.branches]
        return out


@dataclass
class ProgramTrace:
    """A program's executed tree: nodes in order, each fork holding its branches' traces."""

    nodes: list[TraceNode]
    error: str | None = None

    def to_json(self) -> dict:
        """The tree as nested dicts (json.dumps-able)."""
        return {"nodes": [n.to_json() for n in self.nodes], "error": self.error}

    def gens(self) -> list[TraceNode]:
        """Every gen and select node, depth-first (branches included)."""
        out = []
        for n in self.nodes:
            if n.kind in ("gen", "select"):
                out.append(n)
            for b in n.branches if n.kind == "fork" else ():
                out.extend(b.gens())
        return out

    def lines(self, indent: int = 0) -> list[str]:
        """A readable listing: one node per line, branches indented."""
        out = []
        for n in self.nodes:
            label = f"{n.kind}" + (f" {n.name!r}" if n.name else "") + (f" [{n.role}]" if n.role else "")
            extra = ""
            if n.kind == "gen" and n.detail.get("tokens"):
                extra = " " + ", ".join(f"{v} {k}" for k, v in n.detail["tokens"].items() if v)
            elif n.kind == "select":
                extra = f" -> {n.text!r} scores {n.detail.get('scores')}"
            out.append("  " * indent + f"{n.start * 1000:8.1f} ms +{(n.end - n.start) * 1000:.1f} {label}{extra}")
            if n.kind == "fork":
                for i, b in enumerate(n.branches):
                    out.append("  " * (indent + 1) + f"branch {i}:")
                    out.extend(b.lines(indent + 2))
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def to_html(self, path: str | pathlib.Path | None = None, title: str = "sglpy program trace") -> str:
        """A self-contained HTML page of the tree (no script, all text escaped); written to `path` when given."""
        body = th.legend_html() + (f'<p class="node error">error: {th.esc(self.error)}</p>' if self.error else "")
        doc = th.page(title, body + _nodes_html(self.nodes))
        if path is not None:
            pathlib.Path(path).write_text(doc, encoding="utf-8")
        return doc


def _nodes_html(nodes: list[TraceNode]) -> str:
    parts = []
    for n in nodes:
        head = (f'<span class="kind">{th.esc(n.kind)}</span>' + (f" {th.esc(n.name)}" if n.name else "")
                + (f' <span class="muted">[{th.esc(n.role)}]</span>' if n.role else "")
                + f'<span class="time">{n.start * 1000:.1f} ms, {(n.end - n.start) * 1000:.1f} ms</span>')
        inner = ""
        if n.kind == "gen":
            tokens = n.detail.get("tokens") or {}
            inner += f"<div>{th.origin_counts_html(tokens)}</div>" if tokens else ""
            if n.detail.get("finish_reason"):
                inner += f'<div class="muted">finish {th.esc(json.dumps(n.detail["finish_reason"]))}</div>'
        if n.kind == "select":
            rows = "".join(f"<tr><td>{th.esc(c)}</td><td>{th.esc(s)}</td></tr>"
                           for c, s in zip(n.detail.get("choices", []), n.detail.get("scores") or []))
            inner += f"<table><tr><th>choice</th><th>score</th></tr>{rows}</table>"
        if n.text and n.kind not in ("fork", "join"):
            inner += f'<div class="text">{th.esc(n.text)}</div>'
        if n.branches:
            inner += "".join(f"<details open><summary>branch {i}</summary>{_nodes_html(b.nodes)}</details>"
                             for i, b in enumerate(n.branches))
        parts.append(f'<div class="node {th.esc(n.kind.split("_")[0])}">{head}{inner}</div>')
    return "".join(parts)


def tokens_by_origin(meta: Any) -> dict:
    """A gen's token counts by origin from its meta_info (what the backend reports; {} when it reports nothing)."""
    if not isinstance(meta, dict) or "completion_tokens" not in meta:
        return {}
    prompt, cached = int(meta.get("prompt_tokens") or 0), int(meta.get("cached_tokens") or 0)
    out, jumped = int(meta.get("completion_tokens") or 0), int(meta.get("jump_forward_tokens") or 0)
    cached = min(cached, prompt)
    return {"cached": cached, "prefilled": prompt - cached, "sampled": max(out - jumped, 0), "jump_forward": jumped}


def _node(executor, event, origin: float, visited: set) -> TraceNode:
    from .nodes import SglCommitLazy, SglConstantText, SglGen, SglRoleBegin, SglRoleEnd, SglSelect, SglVarScopeBegin, \
        SglVarScopeEnd

    if isinstance(event, (ForkEvent, JoinEvent)):
        kind = "fork" if isinstance(event, ForkEvent) else "join"
        detail = {"size": len(event.children)} if kind == "fork" else {"mode": event.mode}
        branches = [build_trace(c, origin, visited) for c in event.children] if kind == "fork" else []
        return TraceNode(kind, start=event.t - origin, end=event.t - origin, detail=detail, branches=branches)
    node, t0, t1, pos, end_pos, role = event
    text = executor.text_[pos:end_pos]
    name = getattr(node, "name", None)
    meta = executor.meta_info.get(name) if name is not None else None
    if isinstance(node, SglGen):
        kind, detail = "gen", {"tokens": tokens_by_origin(meta)}
        if isinstance(meta, dict):
            detail.update({k: meta[k] for k in ("finish_reason", "e2e_latency", "ttft") if k in meta})
    elif isinstance(node, SglSelect):
        meta = meta if isinstance(meta, dict) else {}
        kind = "select"
        detail = {"choices": list(node.choices), "scores": meta.get("normalized_prompt_logprobs"),
                  "method": type(node.choices_method).__name__ if node.choices_method is not None else None}
        if "normalized_unconditional_prompt_logprobs" in meta:
            detail["unconditional_scores"] = meta["normalized_unconditional_prompt_logprobs"]
        if "cached_tokens" in meta:
            detail["cached_tokens"] = meta["cached_tokens"]
    elif isinstance(node, SglRoleBegin):
        kind, role, detail = "role_begin", node.role, {}
    elif isinstance(node, SglRoleEnd):
        kind, role, detail = "role_end", node.role, {}
    elif isinstance(node, (SglVarScopeBegin, SglVarScopeEnd)):
        kind, detail = "var_scope_begin" if isinstance(node, SglVarScopeBegin) else "var_scope_end", {}
    elif isinstance(node, SglCommitLazy):
        kind, detail = "commit", {}
    elif isinstance(node, SglConstantText):
        kind, detail = "text", {}
    else:
        kind, detail = type(node).__name__, {}
    return TraceNode(kind, name=name, role=role, start=t0 - origin, end=t1 - origin, text=text, detail=detail)


def build_trace(executor, origin: float | None = None, visited: set | None = None) -> ProgramTrace:
    """The ProgramTrace of one executor's records (and, through its forks, of its branches)."""
    visited = set() if visited is None else visited
    visited.add(id(executor))
    events = list(executor.events)
    if origin is None:
        first = [e.t if isinstance(e, (ForkEvent, JoinEvent)) else e[1] for e in events[:1]]
        origin = first[0] if first else time.perf_counter()
    nodes = [_node(executor, e, origin, visited) for e in events]
    err = executor.error_
    return ProgramTrace(nodes, None if err is None else f"{type(err).__name__}: {err}")
