"""The request tables of every route: SGLang 0.5.23's fields at their defaults, what we implement, and why.

One `Schema` per request object: `GENERATE` (/generate), `SAMPLING` (its sampling_params), `COMPLETIONS`,
`CHAT`, `CHAT_MESSAGE`, `STREAM_OPTIONS` (the OpenAI routes), and the small native routes. The parsers
validate with these (wire_schema.Schema.validate) and docs/server.md shows `render_markdown()`
(`python -m sglpy.runtime.server.wire_tables` prints it). tests/server/test_server_wire_schema.py
checks them against SGLang's own definitions (tests/server/data/sglang_schemas.json).
"""

from __future__ import annotations

from ..request import MAX_TOP_LOGPROBS_NUM, TOP_K_ALL
from ..sampling_params import MAX_STOP_REGEX_BYTES, MAX_STOPS
from .wire_schema import (ANY, BOOL, BOOL_OR_LIST, DICT, IDS, INT, INT_LIST, INT_OR_LIST, LIST, NUM, REQUIRED,
                          STR, STR_DICT, STR_LIST, STR_OR_LIST, Check, Schema, Support, WireField, dict_of,
                          int_range, list_of, one_of)

IMPL, NOOP, DEFAULT_ONLY = Support.IMPL, Support.NOOP, Support.DEFAULT_ONLY
MAX_OPENAI_TOP_LOGPROBS = 20


def F(name, check, default, support, doc, **kw) -> WireField:
    """A table row."""
    return WireField(name, check, default, support, doc, **kw)


def _default_only(names_doc: str, *names, check: Check = ANY, default=None) -> list[WireField]:
    return [F(n, check, default, DEFAULT_ONLY, names_doc) for n in names]


DP_RANK = int_range(0, 0)
STOPS = one_of(STR, list_of(STR, MAX_STOPS))
LOGIT_BIAS = dict_of(Check(lambda k: k.lstrip("-").isdigit(), "token id"), NUM,
                     "an object {\"token id\": number}")
STR_OR_OPT_LIST = one_of(STR, list_of(Check(lambda v: v is None or isinstance(v, str), "a string or null",
                                             "strings or nulls")))
DICT_OR_LIST = one_of(DICT, list_of(DICT))
THINKING_BUDGET = Check(lambda v: isinstance(v, dict) and set(v) <= {"thinking_budget"} and (
    v.get("thinking_budget") is None or (type(v["thinking_budget"]) is int and v["thinking_budget"] >= 0)),
    "an object {\"thinking_budget\": an int >= 0} (no custom logit processors)")

# ------------------------------------------------------------------ POST /generate sampling_params
SAMPLING = Schema("sampling_params", tuple([
    F("max_new_tokens", int_range(0), 128, IMPL, "tokens to generate; 0 = prefill only; null = as many as the "
      "context has room for", null_is_value=True),
    F("stop", STOPS, None, IMPL, f"stop strings (at most {MAX_STOPS}); trimmed from the text unless no_stop_trim"),
    F("stop_token_ids", list_of(INT, 1 << 20), None, IMPL, "stop token ids (inside the vocabulary)"),
    F("stop_regex", STOPS, None, IMPL, f"Python `re` patterns searched in the output text (at most {MAX_STOPS}, "
      f"each <= {MAX_STOP_REGEX_BYTES} UTF-8 bytes); the match is trimmed unless no_stop_trim"),
    F("temperature", NUM, 1.0, IMPL, ">= 0; below 1e-6 is greedy"),
    F("top_p", NUM, 1.0, IMPL, "in (0, 1]"),
    F("top_k", INT, TOP_K_ALL, IMPL, f"-1 or {TOP_K_ALL} = whole vocabulary, else >= 1"),
    F("min_p", NUM, 0.0, IMPL, "in [0, 1]"),
    F("frequency_penalty", NUM, 0.0, IMPL, "in [-2, 2]"),
    F("presence_penalty", NUM, 0.0, IMPL, "in [-2, 2]"),
    F("repetition_penalty", NUM, 1.0, IMPL, "in (0, 2]"),
    F("min_new_tokens", int_range(0), 0, IMPL, "stop rules wait until this many tokens"),
    F("n", int_range(1), 1, IMPL, "samples per prompt (the answer becomes a list)"),
    F("json_schema", one_of(STR, DICT), None, IMPL, "JSON schema constraint (a string; an object is accepted too)"),
    F("regex", STR, None, IMPL, "regex constraint"),
    F("ebnf", STR, None, IMPL, "EBNF (lark) grammar constraint"),
    F("structural_tag", one_of(STR, DICT), None, IMPL, "structural-tag constraint (SGLang's shape: structures "
      "[{begin, schema, end}] + triggers; a JSON string, an object is accepted too); see Tool calling"),
    F("ignore_eos", BOOL, False, IMPL, "keep going past EOS"),
    F("skip_special_tokens", BOOL, True, IMPL, "drop special tokens from the text"),
    F("spaces_between_special_tokens", BOOL, True, IMPL, "detokenizer option"),
    F("no_stop_trim", BOOL, False, IMPL, "keep the matched stop string / stop_regex match in the text"),
    F("stream_interval", int_range(1), None, DEFAULT_ONLY, "streams send every step's output"),
    F("logit_bias", LOGIT_BIAS, {}, IMPL, "added to the logits of those token ids (inside the vocabulary)"),
    F("sampling_seed", INT, None, IMPL, "per-request seed (reproducible sampling)"),
    F("custom_params", DICT, None, DEFAULT_ONLY, "custom logit processors are not supported"),
    F("beam_width", int_range(1), None, DEFAULT_ONLY, "beam search is not implemented"),
    F("watermark", DICT, None, DEFAULT_ONLY, "watermarking is not implemented"),
    F("choice", STR_LIST, [], DEFAULT_ONLY, "SGLang contract field without a runtime meaning; use `choices`"),
    F("seed", INT, None, IMPL, "alias of sampling_seed (give one of them)", origin="sglpy"),
    F("choices", list_of(STR, non_empty=True), None, IMPL, "constrain the output to one of these strings",
      origin="sglpy"),
]))

# ------------------------------------------------------------------ POST /generate
_MM = "this multimodal option is not supported (images go in image_data: docs/vision.md)"
_PD = "PD disaggregation is not supported"
GENERATE = Schema("request", tuple([
    F("rid", STR_OR_LIST, None, IMPL, "request id(s); n > 1 adds `-j`; must be unique among running requests"),
    F("session_id", STR, None, NOOP, "identity only (SGLang without --enable-session-radix-cache does the same)"),
    F("text", STR_OR_LIST, None, IMPL, "prompt(s); give text or input_ids"),
    F("input_ids", IDS, None, IMPL, "token prompt(s), ids inside the vocabulary"),
    F("input_embeds", LIST, None, DEFAULT_ONLY, "embedding prompts are not supported"),
    F("image_data", one_of(STR, LIST), None, IMPL, "vision models: the prompt's image(s) "
      "(base64 or a data URL; a server file path with --allow-image-paths; http URLs are refused), one entry (an "
      "image or a list) per prompt of a batch; each image's placeholder must be in the text (docs/vision.md)"),
    *_default_only("video and audio input is not supported", "video_data", "audio_data"),
    *_default_only(_MM, "mm_hashes", "mm_content_hashes"),
    F("use_audio_in_video", BOOL, False, DEFAULT_ONLY, _MM),
    F("video_config", DICT, None, DEFAULT_ONLY, _MM),
    F("sampling_params", DICT_OR_LIST, None, IMPL, "an object (table below) or one per prompt"),
    F("watermark", ANY, None, DEFAULT_ONLY, "watermarking is not implemented"),
    F("return_logprob", BOOL_OR_LIST, None, IMPL, "return logprobs (meta_info)"),
    F("logprob_start_len", INT_OR_LIST, None, IMPL, "first prompt position with an entry; -1 (default) = the "
      "last prompt token only (see Logprobs)"),
    F("top_logprobs_num", INT_OR_LIST, None, IMPL, f"top alternatives per position, at most "
      f"{MAX_TOP_LOGPROBS_NUM} and the vocabulary size"),
    F("token_ids_logprob", IDS, None, DEFAULT_ONLY, "logprobs of chosen ids are not implemented"),
    F("return_sampling_mask", BOOL_OR_LIST, None, DEFAULT_ONLY, "sampling-support logprobs are not implemented"),
    F("sampling_logprobs_mode", one_of(STR, LIST), None, DEFAULT_ONLY, "sampling-support logprobs are not "
      "implemented"),
    F("return_text_in_logprobs", BOOL, False, IMPL, "third element of each logprob entry = the token's text"),
    *_default_only("flat top-logprob arrays are not implemented", "return_flat_raw_top_logprobs",
                   "return_flat_raw_output_top_logprobs", "return_flat_raw_top_logprobs_b64", check=BOOL,
                   default=False),
    F("stream", BOOL, False, IMPL, "server-sent events with cumulative text"),
    F("log_metrics", BOOL, True, IMPL, "false: left out of /metrics (still in the request log)"),
    F("return_hidden_states", one_of(BOOL, STR, LIST), False, DEFAULT_ONLY, "hidden states are not returned"),
    F("return_routed_experts", BOOL, False, DEFAULT_ONLY, "MoE routing is not returned"),
    F("routed_experts_start_len", INT, 0, DEFAULT_ONLY, "MoE routing is not returned"),
    F("return_indexer_topk", BOOL, False, DEFAULT_ONLY, "indexer top-k is not returned"),
    F("modalities", LIST, None, DEFAULT_ONLY, _MM),
    F("session_params", DICT, None, DEFAULT_ONLY, "sessions are not implemented"),
    F("lora_path", STR_OR_OPT_LIST, None, IMPL, "a served LoRA adapter's name, or one per prompt (null: the base "
      "model); docs/lora.md"),
    F("lora_id", STR_OR_OPT_LIST, None, NOOP, "SGLang's internal adapter id, set by its tokenizer manager; adapters "
      "are named by lora_path"),
    F("custom_logit_processor", STR_OR_OPT_LIST, None, DEFAULT_ONLY, "custom logit processors are not supported"),
    F("positional_embed_overrides", ANY, None, DEFAULT_ONLY, "embedding overrides are not supported"),
    *_default_only(_PD, "bootstrap_host", "bootstrap_port", "bootstrap_room", "bootstrap_pair_key",
                   "decode_tp_size"),
    F("routed_dp_rank", DP_RANK, None, IMPL, "0: this server has one data-parallel rank"),
    F("data_parallel_rank", DP_RANK, None, IMPL, "deprecated alias of routed_dp_rank"),
    F("disagg_prefill_dp_rank", DP_RANK, None, IMPL, "0: one data-parallel rank"),
    F("routing_key", STR, None, NOOP, "a router's hint; a single worker has nothing to route"),
    F("conversation_id", STR, None, NOOP, "tracking id (SGLang only records it)"),
    F("http_worker_ipc", STR, None, DEFAULT_ONLY, "SGLang-internal"),
    F("background", BOOL, False, DEFAULT_ONLY, "background responses are not implemented (sglang-router sends "
      "false)"),
    F("require_reasoning", BOOL, False, DEFAULT_ONLY, "no reasoning parser"),
    F("max_thinking_tokens", int_range(0), None, IMPL, "with --reasoning-parser: this request thinks at most this "
      "many tokens, then </think> is forced (default: --max-thinking-tokens)"),
    F("priority", INT, None, NOOP, "SGLang's default server (no --enable-priority-scheduling) ignores it too"),
    F("extra_key", STR_OR_LIST, None, IMPL, "prefix-cache namespace: only requests with the same key share "
      "cached prefixes"),
    F("no_logs", BOOL, False, IMPL, "true: no request-log line for this request"),
    F("custom_labels", STR_DICT, None, NOOP, "metric labels; SGLang without an allow-list ignores them too"),
    F("return_bytes", BOOL, False, DEFAULT_ONLY, "image generation only (sglang-router sends false)"),
    F("return_entropy", BOOL, False, DEFAULT_ONLY, "entropy is not returned (sglang-router sends false)"),
    F("return_prompt_token_ids", BOOL, False, DEFAULT_ONLY, "prompt ids are not returned"),
    F("external_trace_header", DICT, None, DEFAULT_ONLY, "tracing is not implemented"),
    F("received_time", NUM, None, DEFAULT_ONLY, "SGLang-internal"),
    *_default_only("encoder disaggregation is not supported", "need_wait_for_mm_inputs", "num_items_assigned",
                   "encoder_urls"),
    *_default_only(_MM, "max_dynamic_patch", "min_dynamic_patch", "image_max_dynamic_patch",
                   "video_max_dynamic_patch", "images_config", "mm_processor_kwargs"),
    *_default_only("multi-item scoring is not implemented", "multi_item_delimiter_indices",
                   "token_indices_to_pool"),
    F("cache_salt", STR_OR_LIST, None, IMPL, "prefix-cache namespace, combined with extra_key"),
    F("kv_hints", one_of(DICT, LIST), None, NOOP, "hints for HiCache storage backends; this server has none"),
    F("model", STR, None, NOOP, "sglang-router adds `\"model\": null`; the server has one model", origin="router"),
]), "POST /generate")

# ------------------------------------------------------------------ OpenAI routes
_OPENAI_NOOP = "OpenAI bookkeeping; cannot change the output"
STREAM_OPTIONS = Schema("stream_options", (
    F("include_usage", BOOL, False, IMPL, "a last chunk with usage"),
    F("continuous_usage_stats", BOOL, False, DEFAULT_ONLY, "usage in every chunk is not implemented"),
), "stream_options (both OpenAI routes)")


def _openai_common(chat: bool) -> list[WireField]:
    """Fields shared by /v1/completions and /v1/chat/completions (the chat defaults of the sampling extras
    are null: the model's generation config, which here is the plain default)."""
    d = (lambda completion, chat_default: chat_default if chat else completion)
    return [
        *_default_only(_PD, "bootstrap_host", "bootstrap_port", "bootstrap_room"),
        F("routed_dp_rank", DP_RANK, None, IMPL, "0: one data-parallel rank"),
        F("disagg_prefill_dp_rank", DP_RANK, None, IMPL, "0: one data-parallel rank"),
        F("model", STR, "default", IMPL, "the served model; with LoRA adapters an adapter's name or `base:adapter` "
          "selects it (an unknown name is a 404), without them any name is the one model"),
        F("frequency_penalty", NUM, 0.0, IMPL, "in [-2, 2]"),
        F("logit_bias", LOGIT_BIAS, None, IMPL, "token id -> bias (inside the vocabulary)"),
        F("n", int_range(1), 1, IMPL, "choices per prompt"),
        F("presence_penalty", NUM, 0.0, IMPL, "in [-2, 2]"),
        F("seed", INT, None, IMPL, "per-request seed"),
        F("stop", STOPS, None, IMPL, f"stop strings (at most {MAX_STOPS})"),
        F("stream", BOOL, False, IMPL, "server-sent events"),
        F("stream_options", DICT, None, IMPL, "table below"),
        F("temperature", NUM, d(1.0, None), IMPL, ">= 0"),
        F("top_p", NUM, d(1.0, None), IMPL, "in (0, 1]"),
        F("user", STR, None, NOOP, _OPENAI_NOOP),
        F("return_hidden_states", one_of(BOOL, STR), False, DEFAULT_ONLY, "hidden states are not returned "
          "(sglang-router sends false)"),
        *_default_only("not returned", "return_routed_experts", "return_cached_tokens_details",
                       "return_spec_tokens_details", "return_token_ids", check=BOOL, default=False),
        F("routed_experts_start_len", INT, 0, DEFAULT_ONLY, "MoE routing is not returned"),
        F("top_k", INT, d(-1, None), IMPL, "-1 = whole vocabulary"),
        F("min_p", NUM, d(0.0, None), IMPL, "in [0, 1]"),
        F("min_tokens", int_range(0), 0, IMPL, "min_new_tokens"),
        F("regex", STR, None, IMPL, "regex constraint"),
        F("ebnf", STR, None, IMPL, "EBNF constraint"),
        F("repetition_penalty", NUM, d(1.0, None), IMPL, "in (0, 2]"),
        F("stop_token_ids", list_of(INT, 1 << 20), None, IMPL, "stop token ids (inside the vocabulary)"),
        F("stop_regex", STOPS, None, IMPL, f"stop patterns (at most {MAX_STOPS})"),
        F("no_stop_trim", BOOL, False, IMPL, "keep the matched stop in the text"),
        F("ignore_eos", BOOL, False, IMPL, "keep going past EOS"),
        F("skip_special_tokens", BOOL, True, IMPL, "drop special tokens from the text"),
        F("lora_path", STR, None, IMPL, "a served LoRA adapter's name (as the model field's `base:adapter`)"),
        F("session_id", STR, None, NOOP, "identity only (as SGLang without session radix cache)"),
        F("session_params", DICT, None, DEFAULT_ONLY, "sessions are not implemented"),
        F("response_format", DICT, None, IMPL, "text, json_object, json_schema or structural_tag "
      "{structures, triggers}"),
        F("custom_params", THINKING_BUDGET, None, IMPL, "thinking_budget only (SGLang's per-request budget): with "
          "--reasoning-parser this request thinks at most that many tokens, then </think> is forced"),
        F("custom_logit_processor", one_of(STR, LIST), None, DEFAULT_ONLY, "custom logit processors are not "
          "supported"),
        F("watermark", DICT, None, DEFAULT_ONLY, "watermarking is not implemented"),
        F("images_config", DICT, None, DEFAULT_ONLY, _MM),
        F("mm_processor_kwargs", DICT, None, DEFAULT_ONLY, _MM),
        F("data_parallel_rank", DP_RANK, None, IMPL, "deprecated alias of routed_dp_rank"),
        F("rid", STR, None, IMPL, "response id (`cmpl-<rid>` / `chatcmpl-<rid>`)"),
        F("extra_key", STR, None, IMPL, "prefix-cache namespace"),
        F("cache_salt", STR, None, IMPL, "prefix-cache namespace, combined with extra_key"),
        F("priority", INT, None, NOOP, "ignored as by SGLang without priority scheduling"),
        F("spaces_between_special_tokens", BOOL, True, IMPL, "detokenizer option", origin="sglpy"),
        *[F(n, ANY, None, NOOP, _OPENAI_NOOP, origin="openai") for n in
          ("metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier")],
    ]


PROMPT = one_of(STR, list_of(STR, non_empty=True), list_of(INT, non_empty=True),
                list_of(list_of(INT, non_empty=True), non_empty=True))
COMPLETIONS = Schema("request", tuple(_openai_common(chat=False) + [
    F("prompt", PROMPT, REQUIRED, IMPL, "a string, strings, token ids or lists of token ids"),
    F("best_of", int_range(1), None, IMPL, "must equal n (no server-side best-of)"),
    F("echo", BOOL, False, IMPL, "prepend the prompt; with logprobs, the prompt's logprobs come first (not when "
      "streaming)"),
    F("logprobs", int_range(0, MAX_OPENAI_TOP_LOGPROBS), None, IMPL, "number of top alternatives (legacy shape)"),
    F("max_tokens", int_range(1), 16, IMPL, "> 0 (SGLang's rule)"),
    F("suffix", STR, None, DEFAULT_ONLY, "insertion (suffix) is not supported"),
    F("json_schema", one_of(STR, DICT), None, IMPL, "JSON schema constraint"),
    F("custom_labels", STR_DICT, None, NOOP, "metric labels; SGLang without an allow-list ignores them too"),
]), "POST /v1/completions")

CHAT = Schema("request", tuple(_openai_common(chat=True) + [
    F("messages", list_of(DICT, non_empty=True), REQUIRED, IMPL, "the conversation (message table below)"),
    F("logprobs", BOOL, False, IMPL, "return output logprobs"),
    F("top_logprobs", int_range(0, MAX_OPENAI_TOP_LOGPROBS), None, IMPL, "alternatives per token"),
    F("max_tokens", int_range(0), None, IMPL, "deprecated spelling of max_completion_tokens"),
    F("max_completion_tokens", int_range(0), None, IMPL, "0 or null: the room left in the context (SGLang)"),
    F("tools", LIST, None, IMPL, "function tools {type: function, function: {name, description, parameters, "
      "strict}}; calls are constrained to valid arguments (see Tool calling)"),
    F("tool_choice", one_of(STR, DICT), "auto", IMPL, "none / auto / required / {type: function, function: "
      "{name}}; default auto with tools, none without"),
    F("parallel_tool_calls", BOOL, True, IMPL, "false: at most one call"),
    *_default_only("not returned", "return_prompt_token_ids", "return_meta_info", "return_input_ids_in_sglext",
                   "return_output_ids_in_sglext", "return_sampling_mask", "return_flat_raw_output_top_logprobs",
                   check=BOOL, default=False),
    F("sampling_logprobs_mode", STR, None, DEFAULT_ONLY, "sampling-support logprobs are not implemented"),
    F("return_flat_raw_top_logprobs_b64", BOOL, True, NOOP, "only matters with "
      "return_flat_raw_output_top_logprobs"),
    F("reasoning_effort", one_of(STR, NUM), None, IMPL, "forwarded to the chat template as reasoning_effort (as "
      "SGLang does; templates that do not use it ignore it)"),
    F("thinking", ANY, None, DEFAULT_ONLY, "not supported: use chat_template_kwargs (enable_thinking, thinking)"),
    F("task", STR, None, DEFAULT_ONLY, "DeepSeek-V4 only"),
    F("continue_final_message", BOOL, False, IMPL, "continue the last (assistant) message instead of a new turn"),
    F("separate_reasoning", BOOL, True, IMPL, "with --reasoning-parser the thinking goes to reasoning_content "
      "(streamed too); false leaves it in content; without a parser ignored, as SGLang does"),
    F("stream_reasoning", BOOL, True, NOOP, "needs a reasoning parser (sglang-router sends true)"),
    F("chat_template_kwargs", DICT, None, IMPL, "scalar template variables (e.g. enable_thinking)"),
    F("max_dynamic_patch", INT, None, DEFAULT_ONLY, _MM),
    F("min_dynamic_patch", INT, None, DEFAULT_ONLY, _MM),
    F("use_audio_in_video", BOOL, False, DEFAULT_ONLY, _MM),
    F("video_config", DICT, None, DEFAULT_ONLY, _MM),
    F("input_ids", list_of(INT, non_empty=True), None, IMPL, "the prompt as token ids (the template is not "
      "applied)"),
    F("json_schema", one_of(STR, DICT), None, IMPL, "JSON schema constraint", origin="sglpy"),
]), "POST /v1/chat/completions")

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
CHAT_MESSAGE = Schema("message", (
    F("role", Check(lambda v: isinstance(v, str) and v.lower() in CHAT_ROLES, "one of " + ", ".join(CHAT_ROLES)),
      REQUIRED, IMPL, "case-insensitive (SGLang's function/latest_reminder/root roles: 400)"),
    F("content", one_of(STR, list_of(DICT)), None, IMPL, "a string or text parts; required except on an assistant "
      "message with tool_calls"),
    F("tool_call_id", STR, None, IMPL, "tool messages: the id of the call they answer (required)"),
    F("name", STR, None, IMPL, "passed to the chat template"),
    F("phase", STR, None, DEFAULT_ONLY, "not supported"),
    F("reasoning_content", STR, None, IMPL, "assistant messages: passed to the chat template (templates that render "
      "earlier thinking use it)"),
    F("tool_calls", LIST, None, IMPL, "assistant messages: earlier calls [{id, type: function, function: {name, "
      "arguments}}]"),
    F("tools", LIST, None, DEFAULT_ONLY, "tools are not supported"),
    F("prefix", BOOL, None, DEFAULT_ONLY, "use continue_final_message"),
    F("refusal", STR, None, DEFAULT_ONLY, "not rendered by chat templates", origin="openai"),
), "chat message (messages[i])")

# ------------------------------------------------------------------ small native routes (sglpy's own tables)
TOKENIZE = Schema("request", (
    F("text", STR_OR_LIST, None, IMPL, "text(s) to tokenize; give text or prompt"),
    F("prompt", STR_OR_LIST, None, IMPL, "SGLang's name for text (its /tokenize request field)"),
    F("add_special_tokens", BOOL, True, IMPL, "add BOS etc. as the prompt encoder does"),
    F("model", STR, None, NOOP, "one model"),
), "POST /tokenize")
DETOKENIZE = Schema("request", (
    F("tokens", INT_LIST, REQUIRED, IMPL, "token ids inside the vocabulary"),
    F("skip_special_tokens", BOOL, False, IMPL, "drop special tokens"),
    F("model", STR, None, NOOP, "one model"),
), "POST /detokenize")
ABORT = Schema("request", (
    F("rid", STR, None, IMPL, "the request to abort"),
    F("abort_all", BOOL, False, IMPL, "abort every request in flight"),
), "POST /abort_request")
CONCATE_AND_APPEND = Schema("request", (
    F("src_rids", list_of(STR, non_empty=True), REQUIRED, IMPL, "the fork branches' ids (SGLang client sids)"),
    F("dst_rid", STR, REQUIRED, IMPL, "the parent's id"),
), "POST /concate_and_append_request")

LOAD_LORA = Schema("request", (
    F("lora_name", STR, REQUIRED, IMPL, "the name requests use (lora_path, the OpenAI model field)"),
    F("lora_path", STR, REQUIRED, IMPL, "a PEFT adapter folder (adapter_config.json + adapter_model.safetensors)"),
    F("pinned", BOOL, False, NOOP, "SGLang's pin: every adapter stays loaded until unloaded"),
), "POST /load_lora_adapter")
UNLOAD_LORA = Schema("request", (
    F("lora_name", STR, REQUIRED, IMPL, "the adapter to stop serving (refused while requests use it)"),
    F("lora_int_id", INT, None, NOOP, "vLLM's id; the name identifies the adapter"),
), "POST /unload_lora_adapter")
SCHEMAS = (GENERATE, SAMPLING, COMPLETIONS, CHAT, CHAT_MESSAGE, STREAM_OPTIONS, TOKENIZE, DETOKENIZE, ABORT,
           CONCATE_AND_APPEND, LOAD_LORA, UNLOAD_LORA)
# which table corresponds to which schema of SGLang (tests/server/data/sglang_schemas.json)
SGLANG_EQUIVALENT = {"generate": GENERATE, "sampling_params": SAMPLING, "completions": COMPLETIONS,
                     "chat_completions": CHAT, "chat_message": CHAT_MESSAGE, "stream_options": STREAM_OPTIONS}


def render_markdown() -> str:
    """Every table, as docs/server.md shows them between its wire-tables markers."""
    from .wire_schema import markdown

    return "\n".join(markdown(s) for s in SCHEMAS)


if __name__ == "__main__":
    print(render_markdown(), end="")
