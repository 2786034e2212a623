"""`sglpy trace --url URL`: the newest request traces of a server started with --enable-trace (GET /trace)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import webbrowser

from . import trace_html as th

ANSI = {"cached": "\x1b[47m", "prefilled": "\x1b[46m", "sampled": "\x1b[42m", "jump_forward": "\x1b[43m"}
RESET = "\x1b[0m"


def build_parser() -> argparse.ArgumentParser:
    """The `sglpy trace` flags."""
    p = argparse.ArgumentParser(prog="sglpy trace", description="Show the newest request traces of an `sglpy serve` "
                                "started with --enable-trace (per-token origins, timeline).")
    p.add_argument("--url", default="http://127.0.0.1:30000", help="the server (default: %(default)s)")
    p.add_argument("--api-key", default=os.environ.get("SGLPY_API_KEY"),
                   help="the server's --api-key (default: $SGLPY_API_KEY)")
    p.add_argument("--limit", type=int, default=20, help="how many of the newest traces (default: %(default)s)")
    p.add_argument("--rid", help="show this request's trace in full")
    p.add_argument("--json", action="store_true", help="print the JSON the server returns")
    p.add_argument("--html", metavar="PATH", help="write the traces as one self-contained HTML page")
    p.add_argument("--open", action="store_true", help="open that page (or a temporary one) in a browser")
    return p


class TraceClient:
    """GET /trace and /trace/{rid} with the API key as a Bearer header."""

    def __init__(self, url: str, api_key: str | None):
        import requests

        self.url, self.session = url.rstrip("/"), requests.Session()
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def get(self, path: str) -> dict:
        """The JSON of a GET; RuntimeError with the server's message on an error status."""
        r = self.session.get(self.url + path, timeout=30)
        if r.status_code != 200:
            try:
                message = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = r.text[:200]
            raise RuntimeError(f"{self.url}{path}: {r.status_code} {message}")
        return r.json()


def _tokens_line(tokens: list[dict], color: bool) -> str:
    if color:
        return "".join(ANSI.get(t["origin"], "") + t["text"] + RESET for t in tokens)
    return "".join(t["text"] for t in tokens)


def format_record(rec: dict, color: bool) -> str:
    """A request trace as text: summary, timeline, prompt and output (colored by origin on a terminal)."""
    reason = rec.get("finish_reason") or {}
    lines = [f"request {rec['rid']}  {rec['route']}  {rec['outcome']}  finish "
             f"{reason.get('type') if isinstance(reason, dict) else reason}  constraint {rec.get('constraint') or '-'}",
             f"  prompt {rec['prompt_tokens']} tokens ({rec['cached_tokens']} cached), output "
             f"{rec['completion_tokens']} ({rec['jump_forward_tokens']} jump-forward), e2e {rec['e2e_s'] * 1000:.1f} ms, "
             f"grammar {rec['grammar_s'] * 1000:.1f} ms", "  timeline:"]
    for p in rec["timeline"]:
        extra = " ".join(f"{k}={v}" for k, v in p.items() if k not in ("phase", "start", "end"))
        lines.append(f"    {p['start'] * 1000:9.2f} ms  {(p['end'] - p['start']) * 1000:8.2f} ms  {p['phase']}  {extra}")
    counts = {}
    for t in rec["output"]:
        counts[t["origin"]] = counts.get(t["origin"], 0) + 1
    lines.append("  output by origin: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    lines.append("  prompt: " + _tokens_line(rec["prompt"], color))
    lines.append("  output: " + _tokens_line(rec["output"], color))
    return "\n".join(lines)


def format_table(traces: list[dict]) -> str:
    """The trace list as a table, newest first."""
    rows = [f"{'time':8}  {'request':32}  {'route':22}  {'tokens':>11}  {'cached':>6}  {'jump':>5}  {'e2e ms':>8}  "
            f"outcome / prompt"]
    for t in traces:
        when = time.strftime("%H:%M:%S", time.localtime(t["received"]))
        toks = f"{t['prompt_tokens']}->{t['completion_tokens']}"
        prompt = " ".join(t["prompt_preview"].split())[:40]
        rows.append(f"{when:8}  {t['rid'][:32]:32}  {t['route'][:22]:22}  {toks:>11}  {t['cached_tokens']:>6}  "
                    f"{t['jump_forward_tokens']:>5}  {t['e2e_s'] * 1000:>8.1f}  {t['outcome']} / {prompt}")
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    """Run `sglpy trace`; returns the exit code (1: the server refused or tracing is off)."""
    args = build_parser().parse_args(argv)
    client = TraceClient(args.url, args.api_key)
    color = sys.stdout.isatty() and not args.json
    try:
        if args.rid:
            records = [client.get(f"/trace/{args.rid}")]
        else:
            listing = client.get(f"/trace?limit={args.limit}")
            if not listing["enabled"]:
                print(f"tracing is off on {args.url}: start the server with --enable-trace", file=sys.stderr)
                return 1
            if not (args.html or args.open):
                print(json.dumps(listing, indent=1) if args.json else format_table(listing["traces"]))
                return 0
            records = [client.get(f"/trace/{t['rid']}") for t in listing["traces"]]
    except Exception as e:  # noqa: BLE001 - connection errors and refusals alike end with one line
        print(f"sglpy trace: {e}", file=sys.stderr)
        return 1
    if args.rid and not (args.html or args.open):
        print(json.dumps(records[0], indent=1) if args.json else format_record(records[0], color))
        return 0
    path = args.html
    if path is None:
        import tempfile

        path = tempfile.mkstemp(prefix="sglpy-trace-", suffix=".html")[1]
    body = th.legend_html() + "".join(th.request_trace_html(r) for r in records)
    with open(path, "w", encoding="utf-8") as f:
        f.write(th.page(f"sglpy request traces from {args.url}", body))
    print(f"wrote {len(records)} trace(s) to {path}")
    if args.open:
        webbrowser.open("file://" + os.path.abspath(path))
    return 0
