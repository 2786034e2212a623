"""A conversation with tools -> the messages and template variables the chat template renders.

Native templates (ToolSetup.native: the template uses `tools`) get the tools as the `tools` variable, assistant
calls as `tool_calls` with parsed arguments, and tool results as `role: "tool"` messages (transformers'
conventions). Other templates get the format's instructions appended to the system message (or a new one),
assistant calls as their text in the format, and tool results as user messages wrapped in `<tool_response>`.
Tool messages must answer a call id of an earlier assistant message (ToolError names the message otherwise).
"""

from __future__ import annotations

import json

from .registry import ToolSetup
from .spec import Tool, ToolCall, ToolError


def render_conversation(messages: list[dict], setup: ToolSetup, tools: list[Tool] | None) -> tuple[list[dict], dict]:
    """(template messages, extra template variables); `tools` None = not shown (tool_choice none or no tools).

    messages: validated chat messages; an assistant message may carry `tool_calls` (list of ToolCall) and
    content None, a tool message `tool_call_id`.
    """
    out: list[dict] = []
    names: dict[str, str] = {}  # call id -> function name, from earlier assistant messages
    fmt = setup.format
    for i, m in enumerate(messages):
        role = m["role"]
        calls: list[ToolCall] = m.get("tool_calls") or []
        if calls and role != "assistant":
            raise ToolError(f"messages[{i}].tool_calls: only assistant messages carry tool calls", f"messages[{i}]")
        for c in calls:
            names[c.id] = c.name
        if role == "tool":
            cid = m.get("tool_call_id")
            if not cid:
                raise ToolError(f"messages[{i}].tool_call_id is required for a tool message",
                                f"messages[{i}].tool_call_id")
            if cid not in names:
                raise ToolError(f"messages[{i}].tool_call_id {cid!r} answers no tool call of an earlier assistant "
                                "message", f"messages[{i}].tool_call_id")
            if setup.native:
                out.append({"role": "tool", "content": m["content"], "tool_call_id": cid, "name": names[cid]})
            else:
                out.append({"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"})
            continue
        if calls:
            if setup.native:
                msg = {"role": "assistant", "content": m.get("content") or "",
                       "tool_calls": [{"id": c.id, "type": "function",
                                       "function": {"name": c.name, "arguments": json.loads(c.arguments)}}
                                      for c in calls]}
            else:
                text = "\n".join(fmt.render_call(c.name, c.arguments) for c in calls)
                msg = {"role": "assistant", "content": ((m.get("content") or "") + "\n" + text).lstrip("\n")}
            out.append(msg)
            continue
        out.append({k: v for k, v in m.items() if k != "tool_calls"})
    extra: dict = {}
    if tools:
        if setup.native:
            extra["tools"] = [t.to_openai() for t in tools]
        else:
            text = fmt.instructions(tools)
            if out and out[0]["role"] in ("system", "developer"):
                out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}"}
            else:
                out.insert(0, {"role": "system", "content": text})
    return out, extra
