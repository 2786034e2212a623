"""Every public name SGLang 0.5.23's frontend modules offer programs is importable from the matching sglpy module.

`SGLANG_NAMES` is the snapshot of those names (top-level definitions without a leading underscore; `sglang`'s
own `__all__`); `test_snapshot_matches_the_installed_sglang` re-reads them from the installed SGLang source (by
AST, so SGLang's heavy dependencies are not needed) and fails when the snapshot is stale. A name that cannot
apply to sglpy is in `EXCLUDED` with the reason (docs/frontend.md, "SGLang's names"); everything else must
import, so a name that goes missing (e.g. `sglang.lang.ir.REGEX_FLOAT`) fails here.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import pathlib

import pytest

# SGLang module -> the sglpy module a program gets once `sglang` is aliased to `sglpy`
MODULE_MAP = {
    "sglang": "sglpy",
    "sglang.lang.api": "sglpy.api",
    "sglang.lang.ir": "sglpy.ir",
    "sglang.lang.choices": "sglpy.choices",
    "sglang.lang.chat_template": "sglpy.chat_template",
    "sglang.lang.global_config": "sglpy.global_config",
    "sglang.lang.interpreter": "sglpy.interpreter",
    "sglang.lang.tracer": "sglpy.tracer",
    "sglang.lang.backend.base_backend": "sglpy.backend_base",
    "sglang.lang.backend.runtime_endpoint": "sglpy.backend_http",
    "sglang.lang.backend.openai": "sglpy.backend_openai",
    "sglang.lang.backend.anthropic": "sglpy.backend_anthropic",
    "sglang.lang.backend.litellm": "sglpy.backend_litellm",
}

SGLANG_NAMES = {
    "sglang": "Anthropic Crusoe Engine LiteLLM OpenAI Runtime RuntimeEndpoint ServerArgs VertexAI __version__ "
              "assistant assistant_begin assistant_end flush_cache function gen gen_int gen_string get_server_info "
              "global_config greedy_token_selection image select separate_reasoning set_default_backend system "
              "system_begin system_end token_length_normalized unconditional_likelihood_normalized user user_begin "
              "user_end video",
    "sglang.lang.api": "Engine Runtime assistant assistant_begin assistant_end flush_cache function gen gen_int "
                       "gen_string get_server_info image select separate_reasoning set_default_backend system "
                       "system_begin system_end user user_begin user_end video",
    "sglang.lang.ir": "REGEX_BOOL REGEX_FLOAT REGEX_INT REGEX_STR SglArgument SglCommitLazy SglConcateAndAppend "
                      "SglConstantText SglExpr SglExprList SglFork SglFunction SglGen SglGetForkItem SglImage "
                      "SglRoleBegin SglRoleEnd SglSamplingParams SglSelect SglSeparateReasoning SglVarScopeBegin "
                      "SglVarScopeEnd SglVariable SglVideo",
    "sglang.lang.choices": "ChoicesDecision ChoicesSamplingMethod GreedyTokenSelection TokenLengthNormalized "
                           "UnconditionalLikelihoodNormalized greedy_token_selection token_length_normalized "
                           "unconditional_likelihood_normalized",
    "sglang.lang.chat_template": "ChatTemplate ChatTemplateStyle chat_template_registry get_chat_template "
                                 "get_chat_template_by_model_path match_c4ai_command_r match_chat_ml match_chat_yi "
                                 "match_dbrx match_deepseek match_deepseek_janus_pro match_gemma "
                                 "match_granite_instruct match_interns1_chat match_internvl_chat match_llama2_chat "
                                 "match_llama3_instruct match_mistral match_openbmb_minicpm match_orion match_vicuna "
                                 "matching_function_registry register_chat_template "
                                 "register_chat_template_matching_function",
    "sglang.lang.global_config": "GlobalConfig global_config",
    "sglang.lang.interpreter": "ProgramState ProgramStateGroup StreamExecutor cache_program run_internal run_program "
                               "run_program_batch",
    "sglang.lang.tracer": "StopTracing TracerProgramState TracingScope extract_prefix_by_tracing trace_program",
    "sglang.lang.backend.base_backend": "BaseBackend",
    "sglang.lang.backend.runtime_endpoint": "Runtime RuntimeEndpoint compute_normalized_prompt_logprobs",
    "sglang.lang.backend.openai": "INSTRUCT_MODEL_NAMES OpenAI TokenUsage create_logit_bias_int logger "
                                  "openai_completion openai_completion_stream",
    "sglang.lang.backend.anthropic": "Anthropic",
    "sglang.lang.backend.litellm": "LiteLLM",
}

_IR_INTERNAL = "interpreter-internal IR node; sglpy's interpreter has no such node (programs never build it)"
_MATCHER = ("SGLang's per-model-family template matcher; sglpy derives role strings from the model's own jinja "
            "chat template, and register_chat_template_matching_function adds matchers")
EXCLUDED = {
    ("sglang", "Crusoe"): "Crusoe Cloud's endpoint is OpenAI-compatible: sgl.OpenAI(model, base_url=...)",
    ("sglang", "VertexAI"): "needs Google's vertexai SDK and cloud credentials; not offered",
    ("sglang", "ServerArgs"): "SGLang's server option class; sglpy's server takes `sglpy serve` flags (ServerConfig)",
    ("sglang.lang.ir", "SglSamplingParams"): "sglpy's gen parameters are GenParams around the one SamplingParams",
    ("sglang.lang.ir", "SglVideo"): "text-only models (sgl.video raises)",
    ("sglang.lang.ir", "SglGetForkItem"): _IR_INTERNAL,
    ("sglang.lang.ir", "SglVariable"): _IR_INTERNAL,
    ("sglang.lang.ir", "SglConcateAndAppend"): _IR_INTERNAL + " (join(concate_and_append) works at text level)",
    ("sglang.lang.chat_template", "ChatTemplateStyle"): "LLAMA2-style system folding; sglpy renders the model's "
                                                        "own jinja template instead",
    ("sglang.lang.interpreter", "run_internal"): "interpreter internal (sglpy.function runs programs)",
    ("sglang.lang.interpreter", "run_program"): "interpreter internal; sglpy.function.run_program differs",
    ("sglang.lang.interpreter", "run_program_batch"): "interpreter internal; sglpy.function.run_program_batch differs",
    ("sglang.lang.interpreter", "cache_program"): "interpreter internal; use SglFunction.cache(backend)",
    ("sglang.lang.tracer", "TracingScope"): "tracer internal; sglpy traces with SglFunction.trace()",
    ("sglang.lang.backend.runtime_endpoint", "compute_normalized_prompt_logprobs"): "backend internal; the mean "
    "over the scored window is sglpy.backend_base.mean_logprob",
    ("sglang.lang.backend.openai", "logger"): "module logger; sglpy raises instead of logging and retrying",
    ("sglang.lang.backend.openai", "openai_completion"): "backend internal (the request helper of SGLang's backend)",
    ("sglang.lang.backend.openai", "openai_completion_stream"): "backend internal (SGLang's streaming helper)",
}
EXCLUDED.update({("sglang.lang.chat_template", n): _MATCHER for n in SGLANG_NAMES["sglang.lang.chat_template"].split()
                 if n.startswith("match_")})


def _cases():
    return [(mod, name) for mod, names in SGLANG_NAMES.items() for name in names.split()]


@pytest.mark.parametrize("sglang_module,name", _cases())
def test_sglang_name_is_importable_from_sglpy(sglang_module, name):
    module = importlib.import_module(MODULE_MAP[sglang_module])
    if (sglang_module, name) in EXCLUDED:
        return
    assert hasattr(module, name), (f"`from {sglang_module} import {name}` has no sglpy counterpart: "
                                   f"{MODULE_MAP[sglang_module]} lacks {name!r}")
    exec(f"from {MODULE_MAP[sglang_module]} import {name}", {})


def test_exclusions_name_real_sglang_names_that_sglpy_lacks():
    """An exclusion for a name sglpy now offers (or SGLang does not have) is stale."""
    for (mod, name), reason in EXCLUDED.items():
        assert name in SGLANG_NAMES[mod].split(), (mod, name)
        assert reason
        assert not hasattr(importlib.import_module(MODULE_MAP[mod]), name), f"{mod}.{name} is offered now: unexclude it"


def test_regex_names_are_the_grammar_definitions():
    from sglpy.grammar import DTYPE_REGEX
    from sglpy.ir import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR

    assert (REGEX_INT, REGEX_FLOAT, REGEX_BOOL, REGEX_STR) == tuple(DTYPE_REGEX[k] for k in ("int", "float", "bool", "str"))


def _sglang_root():
    spec = importlib.util.find_spec("sglang")
    return pathlib.Path(spec.origin).parent if spec and spec.origin else None


def _defined_names(path: pathlib.Path) -> list[str]:
    out = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append(node.name)
        elif isinstance(node, ast.Assign):
            out += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.append(node.target.id)
    return out


def test_snapshot_matches_the_installed_sglang():
    root = _sglang_root()
    if root is None:
        pytest.skip("SGLang's frontend is not installed (make venv installs sglang==0.5.23 --no-deps)")
    for mod, names in SGLANG_NAMES.items():
        if mod == "sglang":
            tree = ast.parse((root / "__init__.py").read_text())
            got = next(ast.literal_eval(n.value) for n in tree.body
                       if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "__all__")
        else:
            path = root.joinpath(*mod.split(".")[1:]).with_suffix(".py")
            got = [n for n in _defined_names(path) if not n.startswith("_")]
        assert sorted(got) == sorted(names.split()), mod
