"""Engine-process side of the server: the command loop, length checks, aborts and the whitelisted calls."""

from __future__ import annotations

import gc
import importlib
import logging
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

from ..messages import (AbortCmd, CallCmd, CallResult, Chunk, Done, Failed, GenerateCmd, Ready, ShutdownCmd,
                              StartupFailed)

logger = logging.getLogger("sglpy.server.engine")

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's SamplingParams default
CONSTRAINTS = ("regex", "json_schema", "ebnf", "choices")


def supports_constraints(engine) -> bool:
    """False when the engine has no constrained-decoding hook (it would silently ignore the constraint)."""
    return getattr(engine, "constrained", True) is not None


def _jsonable(v):
    return v if v is None or isinstance(v, (str, int, float, bool)) else str(v)


def _context_len(engine) -> int | None:
    """The model's context length as the engine reports it (several spellings tolerated)."""
    for name in ("max_context", "context_len", "max_context_len"):
        v = getattr(engine, name, None)
        if isinstance(v, int):
            return v
    try:
        info = engine.get_server_info()
    except Exception:  # noqa: BLE001
        return None
    for name in ("context_len", "max_context_len", "max_model_len"):
        if isinstance(info.get(name), int):
            return info[name]
    return None


def engine_info(engine, engine_kwargs: dict) -> dict:
    """What the server needs once: model path, context length, chat template, special tokens."""
    tok = engine.tokenizer
    special = {n: _jsonable(getattr(tok, n, None)) for n in ("bos_token", "eos_token", "pad_token", "unk_token")}
    special.update({n: _jsonable(getattr(tok, n, None)) for n in ("bos_token_id", "eos_token_id", "pad_token_id")})
    special["all_special_tokens"] = [str(t) for t in (getattr(tok, "all_special_tokens", None) or [])]
    cfg = getattr(getattr(engine, "runner", None), "hf_config", None)
    template = getattr(tok, "chat_template", None)
    return {
        "model_path": str(getattr(engine, "model_path", None) or engine_kwargs.get("model") or "default"),
        "context_len": _context_len(engine),
        "chat_template": template if isinstance(template, str) else None,
        "special_tokens": special,
        "vocab_size": len(tok) if hasattr(tok, "__len__") else None,
        "model_type": _jsonable(getattr(cfg, "model_type", None)),
        "architectures": list(getattr(cfg, "architectures", None) or []),
        "supports_constraints": supports_constraints(engine),
    }


class EngineWorker:
    """Runs generations for the command loop; one thread per generation, many at once."""

    CALLS = ("get_server_info", "flush_cache", "tokenize", "detokenize", "chat_prompt")

    def __init__(self, engine, info: dict):
        self.engine = engine
        self.tok = engine.tokenizer
        self.context_len = info.get("context_len")
        self._lock = threading.Lock()
        self._active: set[str] = set()
        self._aborted: set[str] = set()

    # ---- generation ----
    def register(self, rid: str) -> None:
        """Called by the command loop before the generation thread starts, so an abort is never lost."""
        with self._lock:
            self._active.add(rid)

    def abort(self, rid: str) -> None:
        """Abort a running generation, or mark one whose thread has not reached the engine yet."""
        with self._lock:
            if rid not in self._active:
                return
            self._aborted.add(rid)
        try:
            self.engine.abort(rid)
        except Exception:  # noqa: BLE001 - an unknown rid at the engine is not an error here
            logger.debug("engine.abort(%s) raised", rid, exc_info=True)

    def _was_aborted(self, rid: str) -> bool:
        with self._lock:
            return rid in self._aborted

    def count_prompt_tokens(self, kwargs: dict) -> int:
        """Prompt length in tokens (what the engine will see)."""
        if kwargs.get("input_ids") is not None:
            return len(kwargs["input_ids"])
        return len(self.tok.encode(kwargs["prompt"]))

    def check_lengths(self, kwargs: dict) -> dict:
        """Reject prompts that do not fit the context; fill max_new_tokens=None with the room left."""
        sp = dict(kwargs.get("sampling_params") or {})
        if self.context_len is None:
            if sp.get("max_new_tokens", 0) is None:
                sp.pop("max_new_tokens")
            return {**kwargs, "sampling_params": sp}
        n = self.count_prompt_tokens(kwargs)
        if n >= self.context_len:
            raise ValueError(f"the prompt has {n} tokens, which does not fit the model's context of "
                             f"{self.context_len} tokens")
        mnt = sp.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
        if mnt is None:
            sp["max_new_tokens"] = self.context_len - n
        elif isinstance(mnt, int) and n + mnt > self.context_len:
            raise ValueError(f"the prompt ({n} tokens) plus max_new_tokens ({mnt}) exceeds the model's context of "
                             f"{self.context_len} tokens")
        return {**kwargs, "sampling_params": sp}

    def generate(self, rid: str, kwargs: dict) -> Iterator[dict]:
        """Yield the engine's cumulative chunks for one prompt; ValueError for a bad request."""
        try:
            if self._was_aborted(rid):
                yield {"text": "", "output_ids": [], "meta_info": {
                    "id": rid, "finish_reason": {"type": "abort", "message": "aborted before start"},
                    "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0, "e2e_latency": 0.0}}
                return
            kwargs = self.check_lengths(kwargs)
            sp = kwargs["sampling_params"]
            if not supports_constraints(self.engine) and any(sp.get(k) is not None for k in CONSTRAINTS):
                raise ValueError("constrained decoding (regex / json_schema / ebnf / choices) is not available "
                                 "in this engine build")
            reaborted = False
            for chunk in self.engine.generate(**kwargs, rid=rid, stream=True):
                if not reaborted and self._was_aborted(rid):
                    reaborted = True  # the abort may have raced the engine registering this rid
                    self.abort(rid)
                yield chunk
        finally:
            with self._lock:
                self._active.discard(rid)
                self._aborted.discard(rid)

    # ---- whitelisted calls (no request field ever names a method, path or code) ----
    def call(self, method: str, args: tuple):
        """Dispatch one of CALLS."""
        if method not in self.CALLS:
            raise ValueError(f"unknown engine call {method!r}")
        return getattr(self, "_call_" + method)(*args)

    def _call_get_server_info(self):
        return self.engine.get_server_info()

    def _call_flush_cache(self):
        return bool(self.engine.flush_cache())

    def _call_tokenize(self, texts: list[str], add_special_tokens: bool = True):
        return [list(self.tok.encode(t, add_special_tokens=add_special_tokens)) for t in texts]

    def _call_detokenize(self, ids: list[int], skip_special_tokens: bool = False):
        vocab = len(self.tok) if hasattr(self.tok, "__len__") else None
        bad = [i for i in ids if vocab is not None and not 0 <= i < vocab]
        if bad:
            raise ValueError(f"token ids out of range [0, {vocab}): {bad[:5]}")
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def _call_chat_prompt(self, messages: list[dict], add_generation_prompt: bool = True,
                          continue_final_message: bool = False, template_kwargs: dict | None = None):
        if not getattr(self.tok, "chat_template", None):
            raise ValueError("this model has no chat template; use /v1/completions or /generate")
        try:
            return self.tok.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt and not continue_final_message,
                continue_final_message=continue_final_message, **(template_kwargs or {}))
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"chat template failed on these messages: {e}") from None
        except Exception as e:  # jinja2 TemplateError (raise_exception in templates)
            raise ValueError(f"chat template failed on these messages: {type(e).__name__}: {e}") from None


class _Sender:
    """Thread-safe writer for the engine -> server pipe."""

    def __init__(self, conn):
        self.conn = conn
        self.lock = threading.Lock()

    def send(self, msg) -> None:
        with self.lock:
            try:
                self.conn.send(msg)
            except (BrokenPipeError, OSError):
                pass  # the server is gone; the command loop notices EOF and exits


def engine_loop_alive(engine) -> bool:
    """Whether the engine's step loop still runs (Engine.is_alive() if it has one, else its loop thread)."""
    check = getattr(engine, "is_alive", None)
    if callable(check):
        return bool(check())
    thread = getattr(engine, "_thread", None)
    return thread is None or thread.is_alive()


def _watchdog(engine, stopping: threading.Event, period: float = 0.5) -> None:
    """A dead step loop would leave every request waiting forever: end the process so the server sees it."""
    while not stopping.wait(period):
        if not engine_loop_alive(engine):
            logger.error("the engine step loop died; exiting the engine process")
            logging.shutdown()
            os._exit(70)


def load_factory(path: str):
    """Resolve 'module:callable' (an operator-given setting, never a request field)."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def engine_main(factory: str, engine_kwargs: dict, cmd_conn, out_conn, log_level: str) -> None:
    """Entry point of the engine process: build the engine, then serve commands until told to stop."""
    # The server process coordinates shutdown (drain, then ShutdownCmd): a Ctrl-C or a SIGTERM sent to the
    # whole process group must not kill the engine under requests that are still finishing.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s engine %(levelname)s %(message)s")
    sender = _Sender(out_conn)
    try:
        engine = load_factory(factory)(**engine_kwargs)
        info = engine_info(engine, engine_kwargs)
    except BaseException as e:  # noqa: BLE001 - report any startup failure to the server
        sender.send(StartupFailed(f"{type(e).__name__}: {e}"))
        return
    # The ~370k objects of imports, model and tokenizer live as long as the process: frozen, they are
    # never rescanned by a full GC pass during serving.
    gc.freeze()
    sender.send(Ready(info))
    stopping = threading.Event()
    threading.Thread(target=_watchdog, args=(engine, stopping), daemon=True, name="engine-watchdog").start()
    worker = EngineWorker(engine, info)
    calls = ThreadPoolExecutor(max_workers=4, thread_name_prefix="engine-call")

    def run_call(cmd: CallCmd):
        try:
            sender.send(CallResult(cmd.call_id, worker.call(cmd.method, cmd.args)))
        except ValueError as e:
            sender.send(CallResult(cmd.call_id, error=str(e), status=400))
        except Exception as e:  # noqa: BLE001
            logger.exception("engine call %s failed", cmd.method)
            sender.send(CallResult(cmd.call_id, error=f"{type(e).__name__}: {e}", status=500))

    def run_generate(cmd: GenerateCmd):
        try:
            for chunk in worker.generate(cmd.rid, cmd.kwargs):
                sender.send(Chunk(cmd.rid, chunk))
            sender.send(Done(cmd.rid))
        except ValueError as e:
            sender.send(Failed(cmd.rid, str(e), 400))
        except Exception as e:  # noqa: BLE001
            logger.exception("request %s failed in the engine", cmd.rid)
            sender.send(Failed(cmd.rid, f"engine error: {type(e).__name__}: {e}", 500))

    while True:
        try:
            msg = cmd_conn.recv()
        except (EOFError, OSError):
            break  # the server process is gone
        if isinstance(msg, GenerateCmd):
            worker.register(msg.rid)
            threading.Thread(target=run_generate, args=(msg,), daemon=True, name=f"gen-{msg.rid[:8]}").start()
        elif isinstance(msg, AbortCmd):
            worker.abort(msg.rid)
        elif isinstance(msg, CallCmd):
            calls.submit(run_call, msg)
        elif isinstance(msg, ShutdownCmd):
            break
    stopping.set()
    try:
        engine.shutdown()
    except Exception:  # noqa: BLE001
        logger.exception("engine shutdown failed")
    calls.shutdown(wait=False, cancel_futures=True)
