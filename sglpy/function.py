"""SglFunction: `@sgl.function` programs with run, run_batch, run_async, bind, trace and cache."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import threading
from typing import Any, Callable, Iterator, Optional, Union

from .global_config import global_config
from .interpreter import StreamExecutor
from .nodes import GenParams, SamplingParams
from .program_state import ProgramState
from .tracer import TracedProgram, constant_prefix, trace_program

# Program-level keywords of run/run_batch: every SamplingParams field (SGLang names: max_new_tokens, not
# gen's max_tokens) and the logprob options; anything else passed to run() is a program argument.
PROGRAM_SAMPLING_KEYS = frozenset(SamplingParams.field_names()) | frozenset(GenParams.OPTIONS) - {"dtype"}


def resolve_backend(backend: Any):
    """The backend to use: the argument, else the default one; a Runtime is unwrapped to its endpoint."""
    backend = backend if backend is not None else global_config.default_backend
    if backend is None:
        raise RuntimeError("no backend: call sgl.set_default_backend(sgl.Engine()) (or RuntimeEndpoint/Runtime) "
                           "or pass backend=")
    return getattr(backend, "endpoint", backend)


def program_defaults(kwargs: dict) -> GenParams:
    """The program-level GenParams from run/run_batch keywords (None = default).

    skip_special_tokens and spaces_between_special_tokens default to global_config's values (SGLang's
    frontend settings), for every backend alike.
    """
    base = {"skip_special_tokens": global_config.skip_special_tokens_in_output,
            "spaces_between_special_tokens": global_config.spaces_between_special_tokens_in_out}
    return GenParams(SamplingParams(**base)).resolve(kwargs)


class SglFunction:
    """A program: a Python function whose first parameter is the state `s`."""

    def __init__(self, func: Callable, num_api_spec_tokens: Optional[int] = None, bind_arguments: Optional[dict] = None):
        params = list(inspect.signature(func).parameters.values())
        if not params or params[0].name != "s":
            raise ValueError(f"the first parameter of sgl.function {func.__name__!r} must be named 's'")
        if num_api_spec_tokens is not None and (not isinstance(num_api_spec_tokens, int) or num_api_spec_tokens < 1):
            raise ValueError(f"num_api_spec_tokens must be a positive int or None, got {num_api_spec_tokens!r}")
        self.func = func
        self.num_api_spec_tokens = num_api_spec_tokens
        self.bind_arguments = dict(bind_arguments or {})
        self.arg_names = [p.name for p in params[1:]]
        self.arg_defaults = [p.default for p in params[1:] if p.default is not p.empty]
        self.__name__ = getattr(func, "__name__", "program")
        self.__doc__ = func.__doc__

    def bind(self, **kwargs) -> "SglFunction":
        """A copy with some arguments fixed."""
        unknown = set(kwargs) - set(self.arg_names)
        if unknown:
            raise ValueError(f"{self.__name__} has no arguments {sorted(unknown)}")
        return SglFunction(self.func, self.num_api_spec_tokens, {**self.bind_arguments, **kwargs})

    def _arguments(self, args: tuple, kwargs: dict) -> dict:
        if len(args) > len(self.arg_names):
            raise TypeError(f"{self.__name__} takes {len(self.arg_names)} arguments, got {len(args)} positional")
        out = {**self.bind_arguments, **dict(zip(self.arg_names, args)), **kwargs}
        unknown = set(out) - set(self.arg_names)
        if unknown and not any(p.kind == p.VAR_KEYWORD for p in inspect.signature(self.func).parameters.values()):
            raise TypeError(f"{self.__name__} got unexpected arguments {sorted(unknown)}")
        return out

    def run(self, *args, stream: bool = False, backend=None, use_thread: bool = True, **kwargs) -> ProgramState:
        """Run once; returns the state as soon as the body returns (reads wait). stream=True runs the body
        in a thread and returns at once.

        Keywords named like a SamplingParams field (max_new_tokens, temperature, stop, stop_regex, ...) or a
        logprob option are the program-level defaults each gen inherits (SGLang's run keywords); the rest
        are the program's arguments.
        """
        sampling = {k: kwargs.pop(k) for k in list(kwargs) if k in PROGRAM_SAMPLING_KEYS}
        return run_program(self, resolve_backend(backend), self._arguments(args, kwargs), program_defaults(sampling),
                           stream=stream, sync=False)

    def run_batch(self, batch_kwargs: list, *, backend=None, num_threads: Union[str, int] = "auto",
                  progress_bar: bool = False, generator_style: bool = False, **sampling_kwargs):
        """Run every item (dicts, or lists of positional values) concurrently; states in input order.

        A failing item does not stop the others: its state's `error()` holds the exception.
        """
        unknown = set(sampling_kwargs) - PROGRAM_SAMPLING_KEYS
        if unknown:
            raise TypeError(f"run_batch got unexpected keyword arguments {sorted(unknown)}")
        sampling = program_defaults(sampling_kwargs)
        items = []
        for item in batch_kwargs:
            if isinstance(item, dict):
                items.append(self._arguments((), item))
            elif isinstance(item, (list, tuple)):
                if len(item) != len(self.arg_names):
                    raise ValueError("Given arguments mismatch the SGL function signature: "
                                     f"{len(item)} values for {self.arg_names}")
                items.append(self._arguments(tuple(item), {}))
            else:
                raise TypeError(f"run_batch items must be dicts or lists, got {type(item).__name__}")
        gen = run_program_batch(self, resolve_backend(backend), items, sampling, num_threads, progress_bar)
        return gen if generator_style else list(gen)

    async def run_async(self, *args, **kwargs) -> ProgramState:
        """`run` from an event loop: the program executes on worker threads and is complete when awaited."""
        def _run():
            state = self.run(*args, **kwargs)
            state.sync()
            return state

        return await asyncio.to_thread(_run)

    async def run_batch_async(self, batch_kwargs: list, **kwargs) -> list[ProgramState]:
        """`run_batch` from an event loop."""
        return await asyncio.to_thread(lambda: self.run_batch(batch_kwargs, **kwargs))

    def trace(self, *, backend=None, **kwargs) -> TracedProgram:
        """The program graph, with placeholders for arguments not given."""
        return trace_program(self.func, {**self.bind_arguments, **kwargs})

    def cache(self, backend=None) -> str:
        """Cache the traced constant prefix on the backend; returns the prefix."""
        return cache_program(self, resolve_backend(backend), min_chars=0)

    def __call__(self, *args, **kwargs):
        return self.run(*args, **kwargs)


def run_program(program: SglFunction, backend, arguments: dict, default_sampling: GenParams,
                stream: bool = False, sync: bool = False) -> ProgramState:
    """Execute the body against a fresh state (in a thread when streaming)."""
    executor = StreamExecutor(backend, default_sampling, backend.get_chat_template(), stream=stream,
                              num_api_spec_tokens=program.num_api_spec_tokens)
    state = ProgramState(executor)

    def body():
        try:
            state.ret_value = program.func(state, **arguments)
        except BaseException as e:
            executor.fail(e)
            if not stream:
                raise
        finally:
            state.body_done.set()
            executor.end()

    if stream:
        state.body_done.clear()
        threading.Thread(target=body, name="sglpy-program", daemon=True).start()
        return state
    body()
    if sync:
        state.sync()
    return state


def cache_program(program: SglFunction, backend, min_chars: Optional[int] = None) -> str:
    """Trace the program's constant prefix and prefill it once (if at least `min_chars` long)."""
    limit = global_config.precache_min_chars if min_chars is None else min_chars
    graph = trace_program(program.func, dict(program.bind_arguments), only_prefix=True)
    prefix = constant_prefix(graph, backend.get_chat_template())
    if prefix and len(prefix) >= limit:
        backend.cache_prefix(prefix)
    return prefix


def _failed_state(backend, sampling: GenParams, exc: BaseException) -> ProgramState:
    executor = StreamExecutor(backend, sampling, backend.get_chat_template())
    executor.fail(exc)
    executor.end()
    return ProgramState(executor)


def run_program_batch(program: SglFunction, backend, items: list[dict], sampling: GenParams,
                      num_threads: Union[str, int], progress_bar: bool) -> Iterator[ProgramState]:
    """Yield one state per item, in input order, running items on a thread pool."""
    if not items:
        return
    if len(items) > 1 and global_config.enable_precache_with_tracing:
        cache_program(program, backend)
    if num_threads == "auto":
        num_threads = max(96, (os.cpu_count() or 1) * 16)
    num_threads = max(1, min(int(num_threads), len(items)))

    def one(args):
        try:
            return run_program(program, backend, args, sampling, sync=True)
        except BaseException as e:  # noqa: BLE001 - surfaced per item through state.error()
            return _failed_state(backend, sampling, e)

    bar = None
    if progress_bar:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(items), desc=program.__name__)
    with concurrent.futures.ThreadPoolExecutor(num_threads) as pool:
        futures = [pool.submit(one, a) for a in items]
        if bar is not None:
            for f in futures:
                f.add_done_callback(lambda _f: bar.update(1))
        try:
            for f in futures:
                yield f.result()
        finally:
            if bar is not None:
                pool.shutdown(wait=True)
                bar.close()
