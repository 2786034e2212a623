"""Per-request size limits checked at the door, before anything reaches the engine process (docs/server.md, Limits).

The body size (--max-request-bytes, 413) is aiohttp's; the queue (--max-queued-requests, 503) is ServerState.admit's.
Here: the prompt's length in characters (so a multi-megabyte prompt is never tokenized), a constraint's text size,
and a JSON schema's nesting depth (so a 1,000-deep schema never occupies a compile worker). Each is a 400 naming
the field and the flag.
"""

from __future__ import annotations

import json

from ..messages import GenerateReqInput
from .http_common import ApiError

SCHEMA_KINDS = ("json_schema", "structural_tag")  # constraints whose text is JSON


def check_request_limits(inp: GenerateReqInput, max_prompt_chars: int, max_constraint_bytes: int,
                         max_schema_depth: int) -> None:
    """ApiError(400) when one generation exceeds a limit (0 disables that limit)."""
    if max_prompt_chars and inp.text is not None and len(inp.text) > max_prompt_chars:
        raise ApiError(400, f"the prompt is {len(inp.text)} characters; this server accepts at most "
                            f"{max_prompt_chars} (--max-prompt-chars)", param="prompt")
    constraint = inp.sampling.constraint
    if constraint is None:
        return
    kind, value = constraint
    size = sum(len(v.encode()) for v in value) if isinstance(value, (list, tuple)) else len(str(value).encode())
    if max_constraint_bytes and size > max_constraint_bytes:
        raise ApiError(400, f"the {kind} constraint is {size} bytes; this server accepts at most "
                            f"{max_constraint_bytes} (--max-constraint-bytes)", param=kind)
    if max_schema_depth and kind in SCHEMA_KINDS and isinstance(value, str):
        depth = json_depth(value, max_schema_depth)
        if depth > max_schema_depth:
            raise ApiError(400, f"the {kind} nests deeper than {max_schema_depth} levels of JSON objects and arrays "
                                "(--max-schema-depth)", param=kind)


def json_depth(text: str, limit: int) -> int:
    """Nesting depth of the JSON in `text`, counted up to limit + 1 (stops there); 0 for text that is not JSON
    (the constraint's own check names that error)."""
    try:
        obj = json.loads(text)
    except RecursionError:
        return limit + 1
    except ValueError:
        return 0
    deepest, stack = 0, [(obj, 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest
