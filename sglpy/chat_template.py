"""Chat templates: role prefix/suffix strings derived from the model's own (jinja) chat template."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Optional

ROLES = ("system", "user", "assistant")
_MARK = "SGLPYCONTENTMARK"


@dataclass(frozen=True)
class ChatTemplate:
    """Per-role (prefix, suffix) strings; the end-of-turn strings in `stop_str` join every gen's stops."""

    name: str
    role_prefix_and_suffix: dict
    default_system_prompt: Optional[str] = None
    stop_str: tuple = ()
    image_token: str = "<image>"

    def __post_init__(self):
        for role, pair in self.role_prefix_and_suffix.items():
            if role not in ROLES:
                raise ValueError(f"unknown role {role!r} in chat template {self.name!r}")
            if len(pair) != 2 or not all(isinstance(x, str) for x in pair):
                raise ValueError(f"role {role!r} needs a (prefix, suffix) pair of strings")

    def get_prefix_and_suffix(self, role: str) -> tuple[str, str]:
        """The strings written before and after a `role` block."""
        if role not in self.role_prefix_and_suffix:
            raise ValueError(f"chat template {self.name!r} has no {role!r} role")
        return self.role_prefix_and_suffix[role]

    def get_prompt(self, messages: list[dict]) -> str:
        """Render OpenAI-style messages the way role blocks would (plus the assistant generation prefix)."""
        out = []
        if messages and messages[0]["role"] != "system" and self.default_system_prompt is not None:
            p, s = self.get_prefix_and_suffix("system")
            out.append(p + self.default_system_prompt + s)
        for m in messages:
            p, s = self.get_prefix_and_suffix(m["role"])
            out.append(p + m["content"] + s)
        out.append(self.get_prefix_and_suffix("assistant")[0])
        return "".join(out)


def _split(rendered: str, where: str) -> tuple[str, str]:
    if rendered.count(_MARK) != 1:
        raise ValueError(f"chat template did not render the {where} probe message exactly once")
    a, b = rendered.split(_MARK)
    return a, b


def derive_chat_template(render: Callable[[list, bool], str], name: str = "hf",
                         bos_token: Optional[str] = None, eos_token: Optional[str] = None) -> ChatTemplate:
    """Probe a renderer `render(messages, add_generation_prompt) -> str` to find each role's prefix/suffix.

    Prefixes are diffs between renders of growing conversations, so a template's conversation-level
    additions (a default system prompt, a BOS token) are separated from the per-role strings.
    """
    roles: dict[str, tuple[str, str]] = {}
    try:
        roles["system"] = _split(render([{"role": "system", "content": _MARK}], False), "system")
        history = [{"role": "system", "content": "S"}]
    except Exception:  # templates that reject a system role: users see a clear error on use
        history = []
    base = render(history, False) if history else ""
    full = render(history + [{"role": "user", "content": _MARK}], False)
    if not full.startswith(base):
        raise ValueError("chat template renders are not incremental; cannot derive role strings")
    roles["user"] = _split(full[len(base):], "user")

    history2 = history + [{"role": "user", "content": "U"}]
    base2 = render(history2, False)
    gen_prompt = render(history2, True)
    full2 = render(history2 + [{"role": "assistant", "content": _MARK}], False)
    if not (full2.startswith(base2) and gen_prompt.startswith(base2)):
        raise ValueError("chat template renders are not incremental; cannot derive the assistant role")
    a_prefix, a_suffix = _split(full2[len(base2):], "assistant")
    # Generation uses exactly what add_generation_prompt writes (thinking templates differ in history).
    if len(gen_prompt) > len(base2):
        a_prefix = gen_prompt[len(base2):]
    roles["assistant"] = (a_prefix, a_suffix)

    default_system = None
    if "system" in roles:
        head = render([{"role": "user", "content": _MARK}], False).split(_MARK)[0]
        head = head[: len(head) - len(roles["user"][0])] if head.endswith(roles["user"][0]) else ""
        sp, ss = roles["system"]
        if head and head.startswith(sp) and head.endswith(ss) and len(head) >= len(sp) + len(ss):
            default_system = head[len(sp): len(head) - len(ss)]

    if bos_token:
        # The tokenizer adds BOS itself when encoding; keeping it in the text would double it.
        roles = {r: (p[len(bos_token):] if p.startswith(bos_token) else p, s) for r, (p, s) in roles.items()}
    end_of_turn = a_suffix.strip() or (eos_token or "")
    stops = (end_of_turn,) if end_of_turn else ()
    return ChatTemplate(name=name, role_prefix_and_suffix=roles, default_system_prompt=default_system,
                        stop_str=stops)


def render_jinja(template: str, bos_token: str = "", eos_token: str = "") -> Callable[[list, bool], str]:
    """A renderer for a raw HF jinja chat template (the server's), with HF's environment settings."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    compiled = env.from_string(template)

    def render(messages, add_generation_prompt):
        return compiled.render(messages=messages, add_generation_prompt=add_generation_prompt,
                               bos_token=bos_token, eos_token=eos_token, tools=None)

    return render


def from_hf_tokenizer(tokenizer, name: str = "hf") -> ChatTemplate:
    """Derive the template from a transformers tokenizer's own chat template (fallback: name match)."""
    if not getattr(tokenizer, "chat_template", None):
        return get_chat_template_by_model_path(getattr(tokenizer, "name_or_path", "") or "")

    def render(messages, add_generation_prompt):
        if not messages:
            return ""
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    bos = getattr(tokenizer, "bos_token", None) if getattr(tokenizer, "add_bos_token", False) else None
    return derive_chat_template(render, name=name, bos_token=bos, eos_token=getattr(tokenizer, "eos_token", None))


def from_jinja(template: str, bos_token: str = "", eos_token: str = "", add_bos: bool = False,
               name: str = "server") -> ChatTemplate:
    """Derive the template from a jinja string (as served by /get_model_info)."""
    render_one = render_jinja(template, bos_token=bos_token, eos_token=eos_token)
    return derive_chat_template(lambda m, g: render_one(m, g) if m else "", name=name,
                                bos_token=bos_token if add_bos else None, eos_token=eos_token)


# ---------------------------------------------------------------- built-in templates (name matching)

CHATML = ChatTemplate(
    name="chatml",
    role_prefix_and_suffix={
        "system": ("<|im_start|>system\n", "<|im_end|>\n"),
        "user": ("<|im_start|>user\n", "<|im_end|>\n"),
        "assistant": ("<|im_start|>assistant\n", "<|im_end|>\n"),
    },
    stop_str=("<|im_end|>",),
)
LLAMA3 = ChatTemplate(
    name="llama-3-instruct",
    role_prefix_and_suffix={
        r: (f"<|start_header_id|>{r}<|end_header_id|>\n\n", "<|eot_id|>") for r in ROLES
    },
    stop_str=("<|eot_id|>",),
)
DEFAULT = ChatTemplate(
    name="default",
    role_prefix_and_suffix={"system": ("SYSTEM:", "\n"), "user": ("USER:", "\n"), "assistant": ("ASSISTANT:", "\n")},
)
_REGISTRY = {t.name: t for t in (CHATML, LLAMA3, DEFAULT)}
_MATCHERS = [
    (re.compile(r"smollm|qwen|tinyllama|chatml|hermes", re.I), "chatml"),
    (re.compile(r"llama-?3.*instruct", re.I), "llama-3-instruct"),
]


# SGLang's registry names: programs register their own templates and model-path matchers here.
chat_template_registry = _REGISTRY
matching_function_registry: list = []


def register_chat_template(template: ChatTemplate) -> None:
    """Make `template` available by name (get_chat_template, chat_template_name=...)."""
    if not isinstance(template, ChatTemplate):
        raise TypeError(f"register_chat_template needs a sglpy.chat_template.ChatTemplate, got {type(template).__name__}")
    _REGISTRY[template.name] = template


def register_chat_template_matching_function(func: Callable[[str], Optional[str]]) -> None:
    """Add `func(model_path) -> template name | None`; registered functions are tried before the built-ins."""
    matching_function_registry.append(func)


def get_chat_template(name: str) -> ChatTemplate:
    """A registered template by name (built-ins: chatml, llama-3-instruct, default)."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown chat template {name!r}; known: {sorted(_REGISTRY)}")
    return _REGISTRY[name]


def get_chat_template_by_model_path(model_path: str) -> ChatTemplate:
    """The first registered matching function's template, else the first built-in pattern's; `default` otherwise."""
    for func in matching_function_registry:
        name = func(model_path)
        if name is not None:
            return get_chat_template(name)
    for pattern, name in _MATCHERS:
        if pattern.search(model_path or ""):
            return _REGISTRY[name]
    return DEFAULT
