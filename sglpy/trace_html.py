"""Self-contained HTML for traces (a program's tree, a server's request traces): no script, everything escaped."""

from __future__ import annotations

import html

ORIGIN_LABELS = {"cached": "cached", "prefilled": "prefilled", "sampled": "sampled", "jump_forward": "jump-forward"}

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; color: #222; margin: 16px 24px; }
h1 { font-size: 20px; } h2 { font-size: 16px; margin: 18px 0 4px; }
.muted { color: #607d8b; font-size: 13px; }
.node { border-left: 3px solid #cfd8dc; margin: 6px 0 6px 4px; padding: 2px 10px; }
.node.gen { border-color: #43a047; } .node.select { border-color: #1e88e5; } .node.fork { border-color: #8e24aa; }
.node.join { border-color: #8e24aa; } .node.role { border-color: #ffb300; } .node.error { border-color: #c62828; }
.kind { font-weight: 600; } .time { color: #607d8b; font-size: 12px; margin-left: 8px; }
.text, .tokens { white-space: pre-wrap; word-break: break-word; font: 13px/1.7 ui-monospace, Menlo, monospace;
  background: #fafafa; border: 1px solid #eceff1; padding: 4px 6px; margin: 3px 0; }
.tok { border-radius: 2px; box-shadow: inset -1px 0 0 rgba(0,0,0,.12); }
.o-cached { background: #e0e0e0; } .o-prefilled { background: #e3f2fd; } .o-sampled { background: #c8e6c9; }
.o-jump_forward { background: #ffe0b2; }
.bar { display: inline-block; height: 10px; vertical-align: middle; }
table { border-collapse: collapse; font-size: 13px; } td, th { padding: 2px 8px; border-bottom: 1px solid #eceff1;
  text-align: left; }
details > summary { cursor: pointer; }
"""


def esc(value) -> str:
    """HTML-escaped text of any value (quotes included)."""
    return html.escape("" if value is None else str(value), quote=True)


def origin_counts_html(counts: dict) -> str:
    """'12 cached · 3 prefilled · ...' with each count on its origin's color (zero counts left out)."""
    parts = [f'<span class="tok o-{esc(k)}">{esc(v)} {esc(ORIGIN_LABELS.get(k, k))}</span>'
             for k, v in counts.items() if v]
    return " ".join(parts)


def tokens_html(tokens: list[dict]) -> str:
    """Tokens as spans colored by origin, their id and logprob in the tooltip."""
    spans = []
    for t in tokens:
        tip = ORIGIN_LABELS.get(t.get("origin"), t.get("origin"))
        if t.get("id") is not None:
            tip += f" · id {t['id']}"
        if t.get("logprob") is not None:
            tip += f" · logprob {t['logprob']:.3f}"
        spans.append(f'<span class="tok o-{esc(t.get("origin"))}" title="{esc(tip)}">{esc(t.get("text"))}</span>')
    return f'<div class="tokens">{"".join(spans)}</div>'


def legend_html() -> str:
    """The origin color legend."""
    return "<p>" + " ".join(f'<span class="tok o-{k}">{esc(v)}</span>' for k, v in ORIGIN_LABELS.items()) + "</p>"


def page(title: str, body: str) -> str:
    """A complete HTML document (inline CSS only, no script)."""
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f'<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src \'unsafe-inline\'">'
            f"<style>{STYLE}</style></head><body><h1>{esc(title)}</h1>{body}</body></html>\n")


def request_trace_html(record: dict) -> str:
    """One server request trace (GET /trace/{rid}) as an HTML fragment: summary, timeline table, tokens."""
    reason = record.get("finish_reason") or {}
    head = (f'<h2>request {esc(record.get("rid"))}</h2><p class="muted">{esc(record.get("route"))} · '
            f'{esc(record.get("outcome"))} · finish {esc(reason.get("type") if isinstance(reason, dict) else reason)}'
            f' · constraint {esc(record.get("constraint") or "none")} · e2e {record.get("e2e_s", 0) * 1000:.1f} ms · '
            f'grammar {record.get("grammar_s", 0) * 1000:.1f} ms</p>')
    total = max(float(record.get("e2e_s") or 0.0), 1e-9)
    rows = []
    for p in record.get("timeline", []):
        dur = p["end"] - p["start"]
        width = max(dur / total * 300, 1)
        detail = ", ".join(f"{k} {esc(v)}" for k, v in p.items() if k not in ("phase", "start", "end"))
        rows.append(f"<tr><td>{esc(p['phase'])}</td><td>{p['start'] * 1000:.2f}</td><td>{dur * 1000:.2f}</td>"
                    f'<td><span class="bar o-sampled" style="width:{width:.0f}px;margin-left:'
                    f'{p["start"] / total * 300:.0f}px"></span></td><td>{detail}</td></tr>')
    timeline = ("<table><tr><th>phase</th><th>start ms</th><th>ms</th><th></th><th>detail</th></tr>"
                + "".join(rows) + "</table>")
    return (head + timeline + "<h2>prompt</h2>" + tokens_html(record.get("prompt", []))
            + "<h2>output</h2>" + tokens_html(record.get("output", [])))
