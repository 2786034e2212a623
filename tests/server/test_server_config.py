"""`sglpy serve` flags <-> ServerConfig/EngineConfig, validation, and the light CLI import."""

import dataclasses
import subprocess
import sys

import pytest

from sglpy.runtime.config import EngineConfig
from sglpy.runtime.server.config import ServerConfig, build_arg_parser, config_from_args


def test_every_config_field_has_a_documented_flag():
    help_text = build_arg_parser().format_help()
    for cls in (ServerConfig, EngineConfig):
        for f in dataclasses.fields(cls):
            if f.name == "engine":
                continue
            flag = "--" + f.name.replace("_", "-")
            assert flag in help_text, f"{flag} missing from --help"
    # each flag has its own help line, not just the generic fallback
    assert "EngineConfig." not in help_text and "ServerConfig." not in help_text


def test_flags_map_field_by_field():
    cfg = config_from_args(["--port", "31234", "--api-key", "k", "--max-queued-requests", "3",
                            "--graceful-shutdown-timeout", "2.5", "--no-log-requests", "--model", "/m",
                            "--max-total-tokens", "1024", "--disable-radix-cache", "--schedule-policy", "fcfs",
                            "--max-context-len", "256", "--num-threads", "1"])
    assert (cfg.port, cfg.api_key, cfg.max_queued_requests) == (31234, "k", 3)
    assert cfg.graceful_shutdown_timeout == 2.5 and cfg.log_requests is False
    assert cfg.engine == EngineConfig(model="/m", max_total_tokens=1024, disable_radix_cache=True,
                                      schedule_policy="fcfs", max_context_len=256, num_threads=1)
    assert cfg.max_inflight_requests == cfg.engine.max_running_requests + 3


def test_defaults_bind_loopback_on_30000():
    cfg = config_from_args([])
    assert (cfg.host, cfg.port, cfg.api_key) == ("127.0.0.1", 30000, None)
    assert cfg.engine == EngineConfig()


@pytest.mark.parametrize("kwargs", [{"port": 70000}, {"max_request_bytes": 0}, {"log_level": "loud"},
                                    {"api_key": ""}, {"graceful_shutdown_timeout": -1},
                                    {"engine_factory": "no_colon"}, {"max_queued_requests": -1}])
def test_bad_values_are_rejected_by_name(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        ServerConfig(**kwargs)


def test_public_dict_redacts_the_api_key():
    d = ServerConfig(api_key="secret").public_dict()
    assert d["api_key"] == "<redacted>" and "secret" not in repr(d)
    assert d["max_total_tokens"] == EngineConfig().max_total_tokens


def test_cli_does_not_import_torch_and_documents_serve():
    code = ("import sys, sglpy.cli, sglpy.runtime.server; "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    out = subprocess.run([sys.executable, "-m", "sglpy.cli", "serve", "--help"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert "--api-key" in out and "--max-running-requests" in out and "--host" in out
    bad = subprocess.run([sys.executable, "-m", "sglpy.cli", "serve", "--port", "99999"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 2 and "port" in bad.stderr
    unknown = subprocess.run([sys.executable, "-m", "sglpy.cli", "bogus"], capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 2 and "unknown command" in unknown.stderr
