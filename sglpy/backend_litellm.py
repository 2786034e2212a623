"""`sgl.LiteLLM`: programs on any chat model LiteLLM routes to (`litellm.completion`), with sgl.OpenAI's rules.

LiteLLM answers in OpenAI's chat shapes, so this is sgl.OpenAI's chat backend with `litellm.completion` in
place of the `openai` client: the same request mapping, select methods, speculative execution and errors for
what the provider cannot take. Requests go out with OpenAI's field names and LiteLLM translates them per
provider. `pip install litellm` (an optional extra: ~230 MB with its dependencies).
"""

from __future__ import annotations

import os
import threading
from typing import Any, Mapping, Optional

from .backend_openai import OpenAI, TokenUsage
from .chat_template import ChatTemplate, get_chat_template


class _Completions:
    """`client.chat.completions.create(**kw)` -> `litellm.completion(**client_params, **kw)`."""

    def __init__(self, litellm, params: dict):
        self._litellm, self._params = litellm, params

    def create(self, **kw):
        return self._litellm.completion(**self._params, **kw)


class _Client:
    def __init__(self, litellm, params: dict):
        self.chat = type("Chat", (), {})()
        self.chat.completions = _Completions(litellm, params)


class LiteLLM(OpenAI):
    """`sgl.LiteLLM(model, chat_template=None, api_key=None, organization=None, base_url=None, timeout=600,
    max_retries=None, default_headers=None, ...)` (SGLang's signature); a chat model."""

    backend_name = "sgl.LiteLLM"

    def __init__(self, model_name: str, chat_template: Any = None, api_key: Optional[str] = None,
                 organization: Optional[str] = None, base_url: Optional[str] = None, timeout: Optional[float] = 600,
                 max_retries: Optional[int] = None, default_headers: Optional[Mapping[str, str]] = None, *,
                 sglang_extensions: bool = False, select_by: str = "auto", litellm_module: Any = None):
        if select_by not in ("auto", "generate"):
            raise ValueError(f"select_by must be 'auto' or 'generate', got {select_by!r}")
        import openai

        if litellm_module is None:
            # LiteLLM fetches its model price list from the network at import unless told to use its bundled copy
            os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            import litellm as litellm_module
        params = {k: v for k, v in {"api_key": api_key, "organization": organization, "base_url": base_url,
                                    "timeout": timeout, "max_retries": max_retries,
                                    "default_headers": default_headers}.items() if v is not None}
        self.client = _Client(litellm_module, params)
        self._openai = openai  # LiteLLM's exceptions subclass openai's
        self.model_name = model_name
        self.base_url = base_url or "litellm"
        self.api_key = api_key
        self.is_chat_model = True
        self.select_by = select_by
        self.token_usage = TokenUsage()
        self._lock = threading.Lock()
        self._extensions = bool(sglang_extensions)  # the provider is unknown: SGLang fields only when told
        self._model_info = None
        self.tokenizer = None
        self._tiktoken_ok = False
        self._logit_bias_int = None
        self.chat_template = (chat_template if isinstance(chat_template, ChatTemplate)
                              else get_chat_template(chat_template or "default"))
