"""Tool-call parsing, incremental: text in, content / call-start / argument-fragment events out (any ToolFormat).

`ToolCallStream.feed(text)` takes the output so far in pieces and returns events as soon as they are
certain: content is held back only while it could be the start of the format's trigger, a call is
announced once its name is complete, and argument text is passed on as it is generated (a small JSON
scanner finds where the arguments end). `parse_tool_calls(text, fmt)` runs the same machine over a whole
output. The layout accepted is the format's canonical text with any whitespace where it has whitespace
(and optional whitespace between JSON tokens), so the constrained output always parses; text that starts
like a call but is not one (only possible without a constraint) stays content.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from .base import ToolFormat
from .spec import ToolCall, new_call_id

WS = "\x00ws"  # sequence item: optional whitespace
NAME = "\x00name"  # sequence item: a JSON string (captured)
_SPACE = " \t\r\n"


def _seq(text: str) -> list[str]:
    """Literal runs of `text` with WS wherever it has whitespace."""
    out: list[str] = []
    for part in text.replace("\t", " ").replace("\n", " ").split(" "):
        if part:
            out.append(part)
        if not out or out[-1] != WS:
            out.append(WS)
    if text and text[-1] not in _SPACE and out and out[-1] == WS:
        out.pop()
    if text and text[0] not in _SPACE and out and out[0] == WS:
        out.pop(0)
    return out


@dataclass
class Content:
    """Free text of the answer."""

    text: str


@dataclass
class CallBegin:
    """A call's name is known (OpenAI: the first `delta.tool_calls[index]` with id, type and name)."""

    index: int
    id: str
    name: str


@dataclass
class CallArgs:
    """More of a call's arguments text."""

    index: int
    text: str


@dataclass
class ParsedOutput:
    """A whole output split into content and complete calls; `incomplete` = it ended inside a call."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    incomplete: bool = False


def _match(buf: str, i: int, seq: list[str], final: bool) -> tuple[str, int, str | None]:
    """Match `seq` at buf[i:]: ("ok", end, name) | ("partial", i, None) | ("fail", i, None)."""
    name = None
    for item in seq:
        if item is WS:
            while i < len(buf) and buf[i] in _SPACE:
                i += 1
            if i == len(buf) and not final:
                return "partial", i, None
        elif item is NAME:
            if i >= len(buf):
                return ("fail" if final else "partial"), i, None
            if buf[i] != '"':
                return "fail", i, None
            j, esc = i + 1, False
            while j < len(buf) and (esc or buf[j] != '"'):
                esc = not esc and buf[j] == "\\"
                j += 1
            if j >= len(buf):
                return ("fail" if final else "partial"), i, None
            try:
                name = json.loads(buf[i:j + 1])
            except ValueError:
                return "fail", i, None
            i = j + 1
        else:
            k = min(len(item), len(buf) - i)
            if buf[i:i + k] != item[:k]:
                return "fail", i, None
            if k < len(item):
                return ("fail" if final else "partial"), i, None
            i += len(item)
    return "ok", i, name


class _ArgsScanner:
    """Finds the end of one JSON value as text arrives (objects/arrays by depth, strings, scalars)."""

    def __init__(self, start: int):
        self.start = self.pos = start
        self.depth, self.in_str, self.esc, self.kind = 0, False, False, None

    def scan(self, buf: str, final: bool) -> int | None:
        """The end index of the value once it is complete, else None."""
        while self.pos < len(buf):
            c = buf[self.pos]
            if self.kind is None:
                self.kind = "nest" if c in "{[" else "str" if c == '"' else "scalar"
                if self.kind == "str":
                    self.in_str = True
                    self.pos += 1
                    continue
            if self.kind == "scalar":
                if c in ",}]; \t\r\n":
                    return self.pos
                self.pos += 1
                continue
            self.pos += 1
            if self.in_str:
                if self.esc:
                    self.esc = False
                elif c == "\\":
                    self.esc = True
                elif c == '"':
                    self.in_str = False
                    if self.kind == "str":
                        return self.pos
            elif c == '"':
                self.in_str = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return self.pos
        return self.pos if final and self.kind == "scalar" and self.pos > self.start else None


class ToolCallStream:
    """Incremental parser for one output in one ToolFormat (see the module docstring)."""

    def __init__(self, fmt: ToolFormat):
        self.fmt = fmt
        head = ["{", WS, '"name"', WS, ":", WS, NAME, WS, ",", WS, json.dumps(fmt.args_key), WS, ":", WS]
        open_seq = _seq(fmt.open)
        self._first = open_seq + ([WS] if open_seq and open_seq[-1] is not WS else []) + head
        self._next_seq = head
        self._sep = [WS] + _seq(fmt.list_sep.strip()) + [WS] if fmt.list_sep else None
        self._close = ([WS] + _seq(fmt.close.strip())) if fmt.close.strip() else []
        self.buf, self.pos, self.state = "", 0, "text"
        self.region = 0  # where the current region started (its text becomes content if it is not a call)
        self.calls: list[ToolCall] = []
        self._name: str | None = None
        self._id = ""
        self._args: _ArgsScanner | None = None
        self._sent_args = 0
        self.incomplete = False

    def feed(self, text: str) -> list:
        """Events for `text` appended to the output."""
        self.buf += text
        return self._run(final=False)

    def finish(self) -> list:
        """Events for the end of the output (held-back text, a call cut short)."""
        if self.state in ("head", "next"):  # ended inside a call's opening: that text is content
            self.incomplete = True
            out = [Content(self.buf[self.pos if self.state == "next" else self.region:])]
            self.pos, self.state = len(self.buf), "text"
            return out
        out = self._run(final=True)
        if self.state == "args":
            self.incomplete = True
        return out

    def _run(self, final: bool) -> list:
        out: list = []
        while True:
            step = getattr(self, "_on_" + self.state)(final, out)
            if not step:
                return out

    def _on_text(self, final: bool, out: list) -> bool:
        trig = self.fmt.trigger
        i = self.buf.find(trig, self.pos)
        if i < 0:
            end = len(self.buf)
            if not final:
                for k in range(min(len(trig) - 1, end - self.pos), 0, -1):
                    if trig.startswith(self.buf[end - k:]):
                        end -= k
                        break
            if end > self.pos:
                out.append(Content(self.buf[self.pos:end]))
                self.pos = end
            return False
        if i > self.pos:
            out.append(Content(self.buf[self.pos:i]))
        self.pos = self.region = i
        self.state = "head"
        return True

    def _on_head(self, final: bool, out: list, seq=None) -> bool:
        status, end, name = _match(self.buf, self.pos, seq or self._first, final)
        if status == "partial":
            return False
        if status == "fail":  # not a call after all: the trigger is text
            if self.state == "next":
                self.state = "text"
                return True
            stop = self.region + len(self.fmt.trigger)
            out.append(Content(self.buf[self.region:stop]))
            self.pos, self.state = stop, "text"
            return True
        self._name, self._id = name, new_call_id()
        out.append(CallBegin(len(self.calls), self._id, name))
        self.pos, self.state = end, "args"
        self._args, self._sent_args = _ArgsScanner(end), end
        return True

    def _on_next(self, final: bool, out: list) -> bool:
        return self._on_head(final, out, self._next_seq)

    def _on_args(self, final: bool, out: list) -> bool:
        a = self._args
        done = a.scan(self.buf, final)
        upto = done if done is not None else (a.pos if a.kind != "scalar" else self._sent_args)
        if upto > self._sent_args:
            out.append(CallArgs(len(self.calls), self.buf[self._sent_args:upto]))
            self._sent_args = upto
        if done is None:
            return False
        self.calls.append(ToolCall(self._name, self.buf[a.start:done], self._id))
        self.pos, self.state = done, "tail"
        return True

    def _on_tail(self, final: bool, out: list) -> bool:
        status, end, _ = _match(self.buf, self.pos, [WS, "}"], final)
        if status == "partial":
            return False
        self.pos = end if status == "ok" else self.pos
        self.state = "after"
        return True

    def _on_after(self, final: bool, out: list) -> bool:
        if self._sep is not None:
            status, end, _ = _match(self.buf, self.pos, self._sep, final)
            if status == "partial":
                return False
            if status == "ok":
                self.pos, self.state = end, "next"
                return True
        status, end, _ = _match(self.buf, self.pos, self._close, final)
        if status == "partial":
            return False
        if status == "ok":
            self.pos = end
        self.state = "text"
        return True


def parse_tool_calls(text: str, fmt: ToolFormat) -> ParsedOutput:
    """Split a whole output into content and the complete calls."""
    p = ToolCallStream(fmt)
    events = p.feed(text) + p.finish()
    content = "".join(e.text for e in events if isinstance(e, Content))
    return ParsedOutput(content, list(p.calls), p.incomplete)
