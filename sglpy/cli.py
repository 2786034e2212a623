"""The `sglpy` command line. `sglpy serve ...` starts the HTTP server (no torch import in this process)."""

from __future__ import annotations

import sys

USAGE = """usage: sglpy <command> [options]

commands:
  serve     serve a model over HTTP (SGLang-native /generate + OpenAI-compatible /v1/*);
            `sglpy serve --help` lists every flag
  trace     the newest request traces of a server started with --enable-trace
            (`sglpy trace --url URL [--rid RID] [--html PATH]`)
"""


def main(argv: list[str] | None = None) -> int:
    """Dispatch `sglpy <command>`; returns the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "serve":
        from sglpy.runtime.server import main as serve_main  # aiohttp only; the engine process imports torch

        return serve_main(rest)
    if command == "trace":
        from sglpy.trace_cli import main as trace_main

        return trace_main(rest)
    print(f"sglpy: unknown command {command!r}\n\n{USAGE}", file=sys.stderr, end="")
    return 2


if __name__ == "__main__":
    sys.exit(main())
