"""The engine's text side around an HF-style tokenizer: prompt encoding, /tokenize, /detokenize, chat prompts, facts."""

from __future__ import annotations


def _jsonable(v):
    return v if v is None or isinstance(v, (str, int, float, bool)) else str(v)


class TokenizerOps:
    """Tokenizer operations an engine offers the server (shared by the runtime Engine and the test FakeEngine)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    @property
    def vocab_size(self) -> int:
        """Token ids are in [0, vocab_size)."""
        return len(self.tokenizer)

    def encode_prompt(self, text: str) -> list[int]:
        """The token ids of a text prompt (with the tokenizer's special tokens, e.g. BOS)."""
        return list(self.tokenizer.encode(text))

    def tokenize(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Token ids of each text."""
        return [list(self.tokenizer.encode(t, add_special_tokens=add_special_tokens)) for t in texts]

    def detokenize(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """The text of token ids; ValueError naming ids outside the vocabulary."""
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token ids out of range [0, {self.vocab_size}): {bad[:5]}")
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def chat_prompt(self, messages: list[dict], add_generation_prompt: bool = True,
                    continue_final_message: bool = False, template_kwargs: dict | None = None) -> str:
        """The prompt the model's chat template renders; ValueError when there is none or it fails."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("this model has no chat template; use /v1/completions or /generate")
        try:
            return self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt and not continue_final_message,
                continue_final_message=continue_final_message, **(template_kwargs or {}))
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"chat template failed on these messages: {e}") from None
        except Exception as e:  # jinja2 TemplateError (raise_exception in templates)
            raise ValueError(f"chat template failed on these messages: {type(e).__name__}: {e}") from None

    def chat_template(self) -> str | None:
        """The jinja chat template, if the tokenizer has one as a string."""
        template = getattr(self.tokenizer, "chat_template", None)
        return template if isinstance(template, str) else None

    def special_tokens(self) -> dict:
        """BOS/EOS/PAD/UNK tokens and ids, and every special token (for /get_model_info)."""
        tok = self.tokenizer
        special = {n: _jsonable(getattr(tok, n, None)) for n in ("bos_token", "eos_token", "pad_token", "unk_token")}
        special.update({n: _jsonable(getattr(tok, n, None)) for n in ("bos_token_id", "eos_token_id", "pad_token_id")})
        special["all_special_tokens"] = [str(t) for t in (getattr(tok, "all_special_tokens", None) or [])]
        return special
