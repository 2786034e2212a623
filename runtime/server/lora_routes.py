"""LoRA adapters over HTTP: POST /load_lora_adapter and /unload_lora_adapter (SGLang's routes; vLLM's /v1/ names
too), the adapters' /v1/models cards, and the OpenAI `model` field read as an adapter (its name or `base:adapter`).

The server keeps the adapters' names (ServerState.loras: the startup ones, then each load and unload through here)
to map a model name without asking the engine; the engine checks every request's adapter again when it builds it."""

from __future__ import annotations

from aiohttp import web

from ..messages import LoadLoraReq, UnloadLoraReq
from .http_common import ApiError, read_json_object
from .state import ServerState
from .wire_tables import LOAD_LORA, UNLOAD_LORA


def _check_enabled(state: ServerState) -> None:
    if not state.config.engine.lora_enabled:
        raise ApiError(400, "this server serves no LoRA adapters (start it with --lora-paths or --enable-lora)")


async def load_lora_adapter(request: web.Request) -> web.Response:
    """POST /load_lora_adapter {lora_name, lora_path}: read, check and serve a PEFT adapter (400 names a problem)."""
    state: ServerState = request.app["state"]
    f = LOAD_LORA.validate(await read_json_object(request))
    _check_enabled(state)
    info = await state.engine.call(LoadLoraReq(f["lora_name"], f["lora_path"]), timeout=300.0)
    state.loras[f["lora_name"]] = f["lora_path"]
    return web.json_response({"success": True, "error_message": "", "adapter": info,
                              "loaded_adapters": dict(state.loras)})


async def unload_lora_adapter(request: web.Request) -> web.Response:
    """POST /unload_lora_adapter {lora_name}: stop serving it (400 while requests use it, or when unknown)."""
    state: ServerState = request.app["state"]
    f = UNLOAD_LORA.validate(await read_json_object(request))
    _check_enabled(state)
    await state.engine.call(UnloadLoraReq(f["lora_name"]))
    state.loras.pop(f["lora_name"], None)
    return web.json_response({"success": True, "error_message": "", "loaded_adapters": dict(state.loras)})


def base_names(state: ServerState) -> set[str]:
    """The names the base model answers to (its id, its path, and "default", which sglang-router sends)."""
    return {state.model_name, state.info.model_path, "default"}


def lora_of_model(state: ServerState, model: str | None) -> str | None:
    """The adapter an OpenAI `model` field names (None: the base model). Without LoRA any name is the one model;
    with adapters an unknown name is a 404 naming the models served (as OpenAI and vLLM answer)."""
    if model is None or not state.config.engine.lora_enabled:
        return None
    if model in state.loras:
        return model
    base, sep, adapter = model.rpartition(":")
    if sep and base in base_names(state) and adapter in state.loras:
        return adapter
    if model in base_names(state):
        return None
    raise ApiError(404, f"model {model!r} is not served here; models: {[state.model_name, *state.loras]} (an "
                        f"adapter also as '{state.model_name}:<adapter>')", param="model")


def adapter_cards(state: ServerState, created: int) -> list[dict]:
    """/v1/models entries of the adapters (vLLM's shape: parent = the base model)."""
    return [{"id": name, "object": "model", "created": created, "owned_by": "sglpy", "root": path,
             "parent": state.model_name, "max_model_len": state.info.context_len}
            for name, path in state.loras.items()]


def add_routes(router: web.UrlDispatcher) -> None:
    """The load / unload routes under SGLang's and vLLM's paths."""
    for prefix in ("", "/v1"):
        router.add_post(prefix + "/load_lora_adapter", load_lora_adapter)
        router.add_post(prefix + "/unload_lora_adapter", unload_lora_adapter)
