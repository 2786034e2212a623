"""What names a LoRA adapter, torch-free (the config and the server parse these): the --lora-paths entries
(SGLang's `name=path`, a bare path, or the JSON object) and the adaptable module names."""

from __future__ import annotations

import json
from dataclasses import dataclass

ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
LORA_MODULES = ATTN_MODULES + MLP_MODULES


@dataclass(frozen=True)
class LoraRef:
    """One adapter to load: its name (what requests ask for) and folder."""

    name: str
    path: str
    pinned: bool = False  # SGLang's field; accepted, every adapter stays loaded until unloaded anyway

    def __str__(self) -> str:
        """The --lora-paths entry that gives this ref back."""
        if self.pinned or "=" in self.name or self.name.startswith("{"):
            return json.dumps({"lora_name": self.name, "lora_path": self.path, "pinned": self.pinned})
        return self.path if self.name == self.path else f"{self.name}={self.path}"


def parse_lora_ref(item) -> LoraRef:
    """`name=path`, a bare path (its own name), the JSON object {"lora_name", "lora_path", "pinned"} (as a string
    or a dict), or a LoraRef."""
    if isinstance(item, LoraRef):
        return item
    if isinstance(item, str) and item.lstrip().startswith("{"):
        try:
            item = json.loads(item)
        except json.JSONDecodeError as e:
            raise ValueError(f"lora_paths entry {item!r} is not valid JSON ({e})") from None
    if isinstance(item, dict) and {"name", "path"} <= set(item):  # a LoraRef as dataclasses.asdict gives it
        item = {"lora_name": item["name"], "lora_path": item["path"], "pinned": item.get("pinned", False)}
    if isinstance(item, dict):
        unknown = sorted(set(item) - {"lora_name", "lora_path", "pinned"})
        if unknown or not isinstance(item.get("lora_path"), str):
            raise ValueError(f"lora_paths entry {item!r}: needs a string lora_path (fields: lora_name, lora_path, "
                             f"pinned){'; unknown ' + str(unknown) if unknown else ''}")
        return LoraRef(str(item.get("lora_name") or item["lora_path"]), item["lora_path"], bool(item.get("pinned")))
    if not isinstance(item, str) or not item:
        raise ValueError(f"lora_paths entries are `name=path`, a path or a JSON object, got {item!r}")
    name, sep, path = item.partition("=")
    return LoraRef(name, path) if sep and name and path else LoraRef(item, item)


def parse_lora_paths(items) -> tuple[LoraRef, ...]:
    """Every entry of --lora-paths, names unique."""
    if items is None:
        return ()
    if isinstance(items, dict):  # one JSON entry, or a mapping of names to paths
        items = [items] if "lora_path" in items else [f"{k}={v}" for k, v in items.items()]
    elif isinstance(items, (str, LoraRef)):
        items = [items]
    refs = tuple(parse_lora_ref(x) for x in items)
    names = [r.name for r in refs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"lora_paths names must be unique, {dup} repeat")
    return refs
