"""Open-loop serving benchmark: Poisson arrivals at several request rates against `sglpy serve`.

Each request is a streaming POST /generate: a shared ~150-token system prefix + a unique question,
greedy, `ignore_eos`, a fixed number of output tokens. Arrivals do not wait for earlier requests
(open loop), so past the server's capacity the queue, TTFT and latency grow without bound: the knee.
Reported per rate: achieved request and output-token throughput, TTFT / inter-token latency (ITL) /
end-to-end percentiles, and the latency of GET /health polled every 50 ms from a separate process while the
load runs (target: under 100 ms; the server's event loop must never wait on the model). The server runs
twice: radix cache on, then off (`--disable-radix-cache`).

    .venv/bin/python benchmarks/serving.py                        # default model, both cache modes
    .venv/bin/python benchmarks/serving.py --quick                # short smoke run
    .venv/bin/python benchmarks/serving.py --url http://127.0.0.1:30000 --rates 1,2   # an existing server

Writes bench_results/serving.json and bench_results/serving.svg (TTFT p50 and throughput vs rate).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

import aiohttp
import requests

WORDS = ("time person year way day thing man world life hand part child eye woman place work week case point "
         "number group problem fact river garden window music letter market island engine bridge forest").split()
RESULTS = pathlib.Path(__file__).resolve().parents[1] / "bench_results"  # git-ignored


@dataclass
class Sample:
    """One request's timings (seconds, relative to its send time)."""

    ok: bool
    ttft: float = 0.0
    e2e: float = 0.0
    output_tokens: int = 0
    itls: list = field(default_factory=list)
    error: str = ""


@dataclass
class RateResult:
    """Aggregates of one (cache mode, offered rate) run; latencies in seconds."""

    cache: str
    offered_rps: float
    requests: int
    errors: int
    achieved_rps: float
    output_tok_s: float
    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    itl_p50: float
    itl_p90: float
    itl_p99: float
    e2e_p50: float
    e2e_p99: float
    cached_token_share: float
    health_p50_ms: float  # GET /health latency during the run
    health_max_ms: float


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank); nan when empty."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def make_prompts(n: int, seed: int) -> list[str]:
    """n prompts sharing one ~150-token system prefix, each with a unique question."""
    rng = random.Random(seed)
    system = "You are a careful assistant. " + " ".join(rng.choice(WORDS) for _ in range(140)) + "\n"
    return [system + "Question %d: " % i + " ".join(rng.choice(WORDS) for _ in range(25)) + "?" for i in range(n)]


async def one(session, url: str, prompt: str, output_len: int, cached: list) -> Sample:
    """One streaming /generate request, timed."""
    body = {"text": prompt, "stream": True,
            "sampling_params": {"max_new_tokens": output_len, "temperature": 0, "ignore_eos": True}}
    t0 = time.perf_counter()
    s = Sample(ok=False)
    last_t, last_n, meta = None, 0, None
    try:
        async with session.post(url + "/generate", json=body) as resp:
            if resp.status != 200:
                return Sample(ok=False, error=f"HTTP {resp.status}: {(await resp.text())[:200]}")
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data: {"):
                    continue
                obj = json.loads(line[6:])
                if "error" in obj:
                    return Sample(ok=False, error=obj["error"]["message"])
                now = time.perf_counter()
                n = obj["meta_info"]["completion_tokens"]
                if n > last_n:
                    if last_t is None:
                        s.ttft = now - t0
                    else:
                        s.itls += [(now - last_t) / (n - last_n)] * (n - last_n)
                    last_t, last_n = now, n
                meta = obj["meta_info"]
        if meta is None:
            return Sample(ok=False, error="the stream carried no output")
        s.ok, s.e2e, s.output_tokens = True, time.perf_counter() - t0, last_n
        cached.append((meta["cached_tokens"], meta["prompt_tokens"]))
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        s.error = repr(e)
    return s


HEALTH_PROBE = """
import http.client, json, sys, time
host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
conn, lat = http.client.HTTPConnection(host, port, timeout=30), []
end = time.monotonic() + seconds
while time.monotonic() < end:
    t0 = time.perf_counter()
    try:
        conn.request("GET", "/health")
        conn.getresponse().read()
    except OSError:
        conn = http.client.HTTPConnection(host, port, timeout=30)
    lat.append(time.perf_counter() - t0)
    time.sleep(0.05)
print(json.dumps(lat))
"""


def start_health_probe(url: str, seconds: float) -> subprocess.Popen:
    """GET /health every 50 ms for `seconds` from its own process (the load generator's GIL does not skew it)."""
    host, port = url.removeprefix("http://").split(":")
    return subprocess.Popen([sys.executable, "-c", HEALTH_PROBE, host, port, str(seconds)], stdout=subprocess.PIPE,
                            text=True)


async def run_rate(url: str, rate: float, duration: float, output_len: int, seed: int) -> tuple[list, float, float]:
    """Fire Poisson arrivals for `duration` s and wait for all; (samples, wall s, cached-token share)."""
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t > duration:
            break
        arrivals.append(t)
    prompts = make_prompts(len(arrivals), seed)
    cached: list = []
    timeout = aiohttp.ClientTimeout(total=duration + 600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        start = time.perf_counter()

        async def fire(at: float, prompt: str):
            await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
            return await one(session, url, prompt, output_len, cached)

        samples = await asyncio.gather(*(fire(a, p) for a, p in zip(arrivals, prompts)))
        wall = time.perf_counter() - start
    share = sum(c for c, _ in cached) / max(1, sum(p for _, p in cached))
    return list(samples), wall, share


def summarize(cache: str, rate: float, samples: list[Sample], wall: float, share: float,
              health: list[float]) -> RateResult:
    """Percentiles and throughput of one rate."""
    ok = [s for s in samples if s.ok]
    itls = [x for s in ok for x in s.itls]
    return RateResult(
        cache=cache, offered_rps=rate, requests=len(samples), errors=len(samples) - len(ok),
        achieved_rps=len(ok) / wall if wall else 0.0, output_tok_s=sum(s.output_tokens for s in ok) / wall,
        ttft_p50=pct([s.ttft for s in ok], 50), ttft_p90=pct([s.ttft for s in ok], 90),
        ttft_p99=pct([s.ttft for s in ok], 99), itl_p50=pct(itls, 50), itl_p90=pct(itls, 90), itl_p99=pct(itls, 99),
        e2e_p50=pct([s.e2e for s in ok], 50), e2e_p99=pct([s.e2e for s in ok], 99), cached_token_share=share,
        health_p50_ms=pct(health, 50) * 1000, health_max_ms=max(health, default=float("nan")) * 1000)


def knee(rows: list[RateResult]) -> str:
    """First rate where queueing dominates: TTFT p50 or e2e p50 above 3x the lowest rate's, or errors."""
    base = rows[0]
    for prev, row in zip([None] + rows[:-1], rows):
        if row.errors or row.ttft_p50 > 3 * base.ttft_p50 or row.e2e_p50 > 3 * base.e2e_p50:
            below = f"{prev.offered_rps:g}" if prev else "below the lowest rate"
            return (f"knee between {below} and {row.offered_rps:g} req/s (at {row.offered_rps:g}: TTFT p50 "
                    f"{row.ttft_p50:.2f} s vs {base.ttft_p50:.2f} s at {base.offered_rps:g}; "
                    f"{row.output_tok_s:.1f} output tok/s)")
    return f"no knee up to {rows[-1].offered_rps:g} req/s (TTFT p50 {rows[-1].ttft_p50:.2f} s)"


def start_server(extra: list[str]) -> tuple[subprocess.Popen, str, str]:
    """Launch `python -m sglpy.runtime.server` on a free port; wait for /health."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tempfile.NamedTemporaryFile(prefix="sglpy-bench-", suffix=".log", delete=False)
    proc = subprocess.Popen([sys.executable, "-m", "sglpy.runtime.server", "--port", str(port), "--no-log-requests",
                             *extra], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {pathlib.Path(log.name).read_text()[-2000:]}")
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return proc, url, log.name
        except requests.ConnectionError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise RuntimeError("server did not become healthy")


def bench_server(url: str, cache: str, rates: list[float], duration: float, output_len: int) -> list[RateResult]:
    """Warm up, then run every rate from a flushed cache."""
    asyncio.run(run_rate(url, 1.0, 2.0, 4, seed=999))  # warm-up (model pages, allocator)
    rows = []
    for rate in rates:
        requests.post(url + "/flush_cache", timeout=60)  # every rate starts with a cold cache
        probe = start_health_probe(url, duration)
        samples, wall, share = asyncio.run(run_rate(url, rate, duration, output_len, seed=int(rate * 1000)))
        health = json.loads(probe.communicate(timeout=120)[0] or "[]")
        row = summarize(cache, rate, samples, wall, share, health)
        rows.append(row)
        print_row(row)
        errs = [s.error for s in samples if not s.ok]
        if errs:
            print(f"    errors: {errs[:3]}")
    return rows


HEADER = (f"{'cache':<6}{'rate':>6}{'reqs':>6}{'err':>5}{'ach r/s':>9}{'out tok/s':>10}{'TTFT p50':>10}{'p90':>8}"
          f"{'p99':>8}{'ITL p50':>9}{'p90':>8}{'p99':>8}{'e2e p50':>9}{'cached':>8}{'health p50/max':>16}")


def print_row(r: RateResult) -> None:
    """One table row."""
    print(f"{r.cache:<6}{r.offered_rps:>6g}{r.requests:>6}{r.errors:>5}{r.achieved_rps:>9.2f}{r.output_tok_s:>10.1f}"
          f"{r.ttft_p50:>10.3f}{r.ttft_p90:>8.3f}{r.ttft_p99:>8.3f}{r.itl_p50 * 1000:>8.1f}m{r.itl_p90 * 1000:>7.1f}m"
          f"{r.itl_p99 * 1000:>7.1f}m{r.e2e_p50:>9.2f}{r.cached_token_share:>8.0%}"
          f"{r.health_p50_ms:>9.1f}/{r.health_max_ms:.0f}ms", flush=True)


def write_svg(rows: list[RateResult], path: pathlib.Path) -> None:
    """Two small line charts (TTFT p50, output tok/s vs offered rate), one line per cache mode, no plot library."""
    w, h, pad = 360, 240, 40
    colors = {"on": "#1f77b4", "off": "#d62728"}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * w}" height="{h}" font-family="sans-serif" '
             'font-size="11">']
    for panel, (key, label) in enumerate((("ttft_p50", "TTFT p50 (s)"), ("output_tok_s", "output tok/s"))):
        x0 = panel * w
        xs = [r.offered_rps for r in rows]
        ys = [getattr(r, key) for r in rows]
        xmax, ymax = max(xs) or 1, (max(ys) or 1) * 1.1
        parts.append(f'<text x="{x0 + pad}" y="15">{label} vs offered req/s</text>')
        parts.append(f'<line x1="{x0 + pad}" y1="{h - pad}" x2="{x0 + w - 10}" y2="{h - pad}" stroke="black"/>')
        parts.append(f'<line x1="{x0 + pad}" y1="25" x2="{x0 + pad}" y2="{h - pad}" stroke="black"/>')
        parts.append(f'<text x="{x0 + 2}" y="30">{ymax:.2g}</text><text x="{x0 + w - 40}" y="{h - pad + 15}">'
                     f'{xmax:g}</text>')
        for cache, color in colors.items():
            pts = [(r.offered_rps, getattr(r, key)) for r in rows if r.cache == cache]
            coords = " ".join(f"{x0 + pad + (x / xmax) * (w - pad - 10):.1f},{h - pad - (y / ymax) * (h - pad - 25):.1f}"
                              for x, y in pts)
            if coords:
                parts.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="2"/>')
                parts.append(f'<text x="{x0 + w - 80}" y="{40 + 14 * list(colors).index(cache)}" fill="{color}">'
                             f'cache {cache}</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts))


def main() -> int:
    """Parse flags, run, print the table and knee, write JSON + SVG."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rates", default="0.25,0.5,1,2,4", help="offered request rates (req/s), comma-separated")
    p.add_argument("--duration", type=float, default=40.0, help="seconds of arrivals per rate")
    p.add_argument("--output-len", type=int, default=32, help="output tokens per request")
    p.add_argument("--url", help="benchmark an already running server (one cache mode, as configured)")
    p.add_argument("--model", help="model for the launched servers (default: the embedded default model)")
    p.add_argument("--cache", default="on,off", help="cache modes to launch: on, off or on,off")
    p.add_argument("--server-arg", action="append", default=[], help="extra flag for launched servers (repeatable)")
    p.add_argument("--quick", action="store_true", help="smoke run: rates 0.5,2, 8 s each, 8 output tokens")
    p.add_argument("--out", default=str(RESULTS / "serving.json"))
    a = p.parse_args()
    rates = [0.5, 2.0] if a.quick else [float(x) for x in a.rates.split(",")]
    duration, output_len = (8.0, 8) if a.quick else (a.duration, a.output_len)
    print(HEADER)
    rows: list[RateResult] = []
    if a.url:
        rows += bench_server(a.url.rstrip("/"), "given", rates, duration, output_len)
    else:
        for cache in a.cache.split(","):
            extra = (["--model", a.model] if a.model else []) + list(a.server_arg)
            extra += ["--disable-radix-cache"] if cache == "off" else []
            proc, url, log = start_server(extra)
            try:
                rows += bench_server(url, cache, rates, duration, output_len)
            finally:
                proc.terminate()
                proc.wait(60)
                os.unlink(log)
    for cache in dict.fromkeys(r.cache for r in rows):
        print(f"cache {cache}: {knee([r for r in rows if r.cache == cache])}")
    out = pathlib.Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rates": rates, "duration_s": duration, "output_len": output_len,
                               "rows": [asdict(r) for r in rows]}, indent=1))
    write_svg(rows, out.with_suffix(".svg"))
    print(f"wrote {out} and {out.with_suffix('.svg')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
