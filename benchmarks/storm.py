"""Storm: sustained honest load with hostile clients, an engine crash, a compile-worker crash and a burst, at once.

Starts `sglpy serve` on loopback in its own process group (with an API key; the audited engine records any file
the engine process opens), then runs, in one invocation:
  control A   the honest mix alone (--control-minutes / 2)
  storm       the same honest mix (--clients closed-loop clients: chat, JSON schema, regex, select, streaming,
              n > 1, a shared few-shot prefix; through the openai client and /generate) plus ~--hostile-rate of
              hostile requests (benchmarks/storm_traffic.py), --idle-connections idle TCP connections, and at
              random moments: kill -9 of the engine, kill -9 of a compile worker mid-compile, a --burst of
              requests at once (queue overflow)
  drain       KV in use, running requests and radix cache against the idle baseline
  control B   the honest mix alone again (the box is shared: control runs bracket the storm)
  shutdown    SIGTERM; every process of the server's group must be gone within --graceful-shutdown-timeout + 5 s
Everything is bounded: each request by 120 s, the server by a deadline; the server is killed on any exit.

    .venv/bin/python benchmarks/storm.py [--minutes 10] [--clients 64] [--json out.json] [--check]
    --server-arg=--model=PATH passes a flag to `sglpy serve`; --check exits 1 when a correctness target fails.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time

import psutil
import requests

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from storm_report import markdown, report, targets, timing_misses  # noqa: E402
from storm_traffic import HONEST_KINDS, HOSTILE, ROUTES_NEEDING_KEY, Traffic  # noqa: E402

from sglpy.runtime.testing.server_harness import free_port  # noqa: E402

KEY = "storm-key"
AUDITED = "sglpy.runtime.testing.audit:AuditedEngine"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="length of the storm phase")
    p.add_argument("--control-minutes", type=float, default=None, help="control runs in total (default: "
                   "min(minutes, 4); half before the storm, half after)")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--hostile-rate", type=float, default=0.1, help="share of storm requests that are hostile")
    p.add_argument("--burst", type=int, default=500)
    p.add_argument("--idle-connections", type=int, default=1000)
    p.add_argument("--max-tokens", type=int, default=24, help="output tokens of the honest chat / stream requests")
    p.add_argument("--graceful-shutdown-timeout", type=float, default=10.0)
    p.add_argument("--server-arg", action="append", default=[], help="one more `sglpy serve` flag (repeatable)")
    p.add_argument("--no-audit", action="store_true", help="serve the plain engine (--engine-factory in "
                   "--server-arg replaces the audited one too)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write every number here")
    p.add_argument("--check", action="store_true", help="exit 1 when a correctness target fails")
    return p.parse_args(argv)


class ServerProc:
    """`sglpy serve` in its own session: started, probed, and always stopped (SIGKILL to the group at the end)."""

    def __init__(self, args, log_path: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        extra = list(args.server_arg)
        if not args.no_audit and not any(a.startswith("--engine-factory") for a in extra):
            extra += [f"--engine-factory={AUDITED}"]
        self.cmd = [sys.executable, "-m", "sglpy.runtime.server", "--host", "127.0.0.1", "--port", str(self.port),
                    "--api-key", KEY, "--graceful-shutdown-timeout", str(args.graceful_shutdown_timeout),
                    "--no-log-requests", "--log-level", "warning", *extra]
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_healthy(self, timeout: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} during startup")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return time.monotonic() - t0
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not healthy after {timeout:.0f} s")

    def info(self, timeout: float = 90.0) -> dict:
        """/get_server_info, waiting through an engine restart (503) for up to `timeout` seconds."""
        t0 = time.monotonic()
        while True:
            r = requests.get(self.url + "/get_server_info", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
            if r.status_code == 200 or time.monotonic() - t0 > timeout:
                r.raise_for_status()
                return r.json()
            time.sleep(0.2)

    def wait_standby_idle(self, timeout: float = 600.0) -> float | None:
        """Wait until the standby engine process (if any) has done its work and sleeps, so that the control phase
        does not measure the spare's start; seconds waited, or None without a standby."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            pid = self.info().get("engine_standby_pid")
            if not pid:
                return None
            try:
                p = psutil.Process(pid)
                before = _cpu(p)
                time.sleep(2.0)
                if _cpu(p) - before < 0.05:
                    return round(time.monotonic() - t0, 1)
            except psutil.Error:
                time.sleep(0.5)
        return round(time.monotonic() - t0, 1)

    def group_pids(self) -> list[int]:
        out = subprocess.run(["pgrep", "-g", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [int(x) for x in out.split()]

    def sigterm(self, limit: float) -> dict:
        """SIGTERM the server's process group; how long until the server and every process of its group are gone."""
        t0 = time.monotonic()
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            code = self.proc.wait(limit)
        except subprocess.TimeoutExpired:
            code = None
        while self.group_pids() and time.monotonic() - t0 < limit:
            time.sleep(0.1)
        return {"exit_code": code, "seconds": round(time.monotonic() - t0, 2), "left": self.group_pids()}

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)
        self.log.close()


def rss_mb(pid: int | None) -> float | None:
    try:
        return round(psutil.Process(pid).memory_info().rss / 2 ** 20, 1) if pid else None
    except psutil.Error:
        return None


def _cpu(p: psutil.Process) -> float:
    try:
        return sum(p.cpu_times()[:2])
    except psutil.Error:
        return 0.0


def engine_children(engine_pid: int) -> list[psutil.Process]:
    try:
        return [c for c in psutil.Process(engine_pid).children()
                if "grammar_worker" in " ".join(c.cmdline())]
    except psutil.Error:
        return []


class Storm:
    """One run's clients, fault injectors and the records they leave."""

    def __init__(self, args, server: ServerProc):
        self.args, self.server = args, server
        self.rng = random.Random(args.seed)
        self.fates, self.hostile, self.events, self.rss = [], [], [], []
        self.phase = "warmup"
        self.stop_at = 0.0
        self.hostile_tasks: set = set()
        self.faults_pending = False  # the storm's clients keep going until the last fault has ended

    # ---- honest clients ----
    async def client(self, t: Traffic, i: int, hostile_rate: float):
        rng = random.Random(self.args.seed * 1000 + i)
        while time.monotonic() < self.stop_at or self.faults_pending:  # honest traffic around every fault
            if hostile_rate and rng.random() < hostile_rate / (1 - hostile_rate):
                kind = rng.choice(sorted(HOSTILE))
                task = asyncio.ensure_future(self.run_hostile(t, kind))
                self.hostile_tasks.add(task)
                task.add_done_callback(self.hostile_tasks.discard)
            fate = await t.honest(rng.choice(HONEST_KINDS), self.phase)
            self.fates.append(fate)
            if fate.status in (429, 503) and fate.retry_after:
                await asyncio.sleep(min(float(fate.retry_after), 5.0))

    async def run_hostile(self, t: Traffic, kind: str):
        self.hostile.append(await t.hostile(kind))

    async def phase_run(self, t: Traffic, name: str, seconds: float, hostile_rate: float = 0.0, faults=()):
        self.phase = name
        self.stop_at = time.monotonic() + seconds
        self.events.append({"event": f"{name} start", "t": time.monotonic()})
        jobs = [asyncio.ensure_future(self.client(t, i, hostile_rate)) for i in range(self.args.clients)]
        if hostile_rate:  # every hostile kind at least once, whatever the rate drew
            jobs += [asyncio.ensure_future(self.run_hostile(t, kind)) for kind in sorted(HOSTILE)]
        jobs += [asyncio.ensure_future(f) for f in faults]
        await asyncio.gather(*jobs)
        self.events.append({"event": f"{name} end", "t": time.monotonic()})

    # ---- faults ----
    async def faults(self, t: Traffic, schedule: list[tuple[float, str]]):
        """The faults one after another, each at its moment or as soon as the one before has ended (an engine
        restart can outlast a short storm's third)."""
        t0 = time.monotonic()
        self.faults_pending = True
        try:
            for delay, name in schedule:
                await asyncio.sleep(max(0.0, t0 + delay - time.monotonic()))
                await getattr(self, name)(t)
        finally:
            self.faults_pending = False

    async def kill_engine(self, t: Traffic):
        pid = (await asyncio.to_thread(self.server.info))["engine_pid"]
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        ev = {"event": "kill -9 engine", "t": t0, "pid": pid}
        self.events.append(ev)
        while "first_status" not in ev and time.monotonic() - t0 < 60:  # what a new request gets, and how soon
            try:
                status, body, retry = await t.post_json("/generate", {"text": "probe", "sampling_params": {
                    "max_new_tokens": 1}})
            except Exception as e:  # noqa: BLE001 - a refused connection is a finding too
                ev.setdefault("probe_errors", []).append(repr(e)[:120])
                await asyncio.sleep(0.05)
                continue
            if status == 503 and "overloaded" in json.dumps(body):  # refused by load, not yet told of the death
                ev["probes_refused_as_overloaded"] = ev.get("probes_refused_as_overloaded", 0) + 1
                await asyncio.sleep(0.02)
                continue
            ev["first_status"], ev["first_after_s"] = status, round(time.monotonic() - t0, 3)
            ev["first_retry_after"], ev["first_message"] = retry, json.dumps(body)[:160]
        while time.monotonic() - t0 < 120:
            status, _, _ = await t.raw("GET", "/health")
            if status == 200:
                ev["serving_again_after_s"] = round(time.monotonic() - t0, 2)
                break
            await asyncio.sleep(0.1)
        ev["t_back"] = time.monotonic()

    async def kill_compile_worker(self, t: Traffic):
        engine_pid = (await asyncio.to_thread(self.server.info))["engine_pid"]
        for _ in range(60):  # the workers are up (not still starting, e.g. after an engine restart)
            status, _, _ = await t.post_json("/generate", {"text": "x", "sampling_params": {
                "max_new_tokens": 12, "regex": f"r{self.rng.randrange(10 ** 6)}[0-9]"}})  # new: no cache hit
            if status == 200:
                break
            await asyncio.sleep(1.0)
        for _ in range(60):  # no other compile running (a hostile one), so the worker that burns CPU next is ours
            workers = engine_children(engine_pid)
            before = {w.pid: _cpu(w) for w in workers}
            await asyncio.sleep(0.5)
            if all(_cpu(w) - before[w.pid] < 0.02 for w in workers):
                break
        regex = "(a{0,100}){0,100}(b{0,100}){0,100}" + "".join(self.rng.choice("cdefgh") for _ in range(8))
        ev = {"event": "kill -9 compile worker", "t": time.monotonic()}
        self.events.append(ev)
        # sent until the server admits it: under load it refuses it (503 overloaded) while the honest clients, who
        # wait their Retry-After, take the places that free up; a refusal comes back at once, an admitted one compiles
        give_up = time.monotonic() + 300
        while True:
            victim = asyncio.ensure_future(t.post_json("/generate", {"text": "x", "sampling_params": {
                "max_new_tokens": 8, "regex": regex}}))
            await asyncio.wait({victim}, timeout=1.0)
            refused = victim.done() and not victim.exception() and victim.result()[0] == 503 \
                and "overloaded" in json.dumps(victim.result()[1])
            if not refused or time.monotonic() > give_up:
                break
            ev["refused_first"] = ev.get("refused_first", 0) + 1
            await asyncio.sleep(0.1)
        seen, killed = {}, []
        for _ in range(40):  # kill every worker whose CPU time grows (ours, and any other compile or starting
            if victim.done():  # worker meanwhile) until our request has its answer: it may wait behind another
                break
            workers = engine_children(engine_pid)
            before = {w.pid: _cpu(w) for w in workers}
            await asyncio.sleep(0.5)
            seen = {w.pid: round(_cpu(w) - before[w.pid], 3) for w in workers}
            busy = [w for w in workers if seen[w.pid] > 0.02]
            if busy and not victim.done():
                killed += [w.pid for w in busy]
                for w in busy:
                    w.kill()
                await asyncio.sleep(0.5)
        if killed:
            ev["pids"] = killed
        else:
            ev["skipped"] = f"no compile worker was busy (CPU s per 0.5 s: {seen})"
        try:
            status, body, _ = await asyncio.wait_for(victim, 120)
            ev["victim_status"] = status
            err = (body.get("error") or {}) if isinstance(body, dict) else {"message": str(body)}
            ev["victim_error"], ev["victim_message"] = err.get("type"), str(err.get("message"))[:160]
        except Exception as e:  # noqa: BLE001
            ev["victim_status"], ev["victim_error"] = None, repr(e)[:120]

    async def burst(self, t: Traffic):
        ev = {"event": f"burst of {self.args.burst}", "t": time.monotonic()}
        self.events.append(ev)

        async def one(i):
            try:
                async with t.session.post(t.url + "/generate", headers=t.headers, json={
                        "text": f"burst {i}", "sampling_params": {"max_new_tokens": 4}}) as resp:
                    body = await resp.text()
                    return resp.status, resp.headers.get("Retry-After"), body[:160]
            except Exception as e:  # noqa: BLE001
                return type(e).__name__, None, repr(e)[:160]

        got = await asyncio.gather(*(one(i) for i in range(self.args.burst)))
        ev["statuses"] = dict(collections.Counter(str(s) for s, _, _ in got))
        ev["example"] = {str(s): body for s, _, body in got if s != 200}
        ev["503_without_retry_after"] = sum(1 for s, ra, _ in got if s in (429, 503) and not ra)
        ev["seconds"] = round(time.monotonic() - ev["t"], 2)
        ev["t_end"] = time.monotonic()

    async def idle_connections(self, n: int, until: float) -> dict:
        host, port = "127.0.0.1", self.server.port
        conns, failed = [], 0
        for _ in range(n):
            try:
                conns.append(await asyncio.open_connection(host, port))
            except OSError:
                failed += 1
        t0 = time.monotonic()
        until = max(until, t0 + 45)  # opening them can take a loaded box most of a short storm: watch past the
        closed_at = {}  # server's keep-alive (30 s by default) whatever is left
        while time.monotonic() < until:
            for i, (reader, _) in enumerate(conns):
                if i not in closed_at and reader.at_eof():
                    closed_at[i] = time.monotonic() - t0
            if len(closed_at) == len(conns):
                break
            await asyncio.sleep(0.5)
            for reader, _ in conns:  # feed EOF detection
                if not reader.at_eof():
                    try:
                        await asyncio.wait_for(reader.read(1), 0.001)
                    except (asyncio.TimeoutError, OSError):
                        pass
        for _, w in conns:
            w.close()
        times = sorted(closed_at.values())
        return {"opened": len(conns), "failed_to_open": failed, "closed_by_server": len(times),
                "closed_after_s_median": times[len(times) // 2] if times else None}

    async def sample_rss(self, every: float, until: float):
        t0 = time.monotonic()
        while time.monotonic() < until:
            try:
                pid = (await asyncio.to_thread(self.server.info, 5.0)).get("engine_pid")
            except requests.RequestException:  # the engine is restarting: the server's RSS still counts
                pid = None
            self.rss.append({"t_min": round((time.monotonic() - t0) / 60, 2), "server_mb": rss_mb(self.server.proc.pid),
                             "engine_mb": rss_mb(pid), "workers_mb": round(sum(
                                 rss_mb(w.pid) or 0 for w in engine_children(pid)), 1) if pid else None})
            await asyncio.sleep(every)

    async def drain(self, t: Traffic, baseline: dict, timeout: float = 60.0) -> dict:
        """Wait until nothing runs and KV in use is back to the baseline; report what is left."""
        t0 = time.monotonic()
        for task in list(self.hostile_tasks):
            task.cancel()
        while True:
            info = await asyncio.to_thread(self.server.info)
            kv = info["kv_pool"]
            state = {"kv_used": kv["used"], "radix_cached": kv["cached"], "inflight": info["num_inflight_requests"],
                     "running": info.get("num_running_reqs"), "waiting": info.get("num_waiting_reqs")}
            if (state["inflight"] == 0 and kv["used"] <= baseline["kv_used"]) or time.monotonic() - t0 > timeout:
                state["seconds"] = round(time.monotonic() - t0, 2)
                return state
            await asyncio.sleep(0.5)


def fault_schedule(rng: random.Random, seconds: float) -> list[tuple[float, str]]:
    """Three faults at random moments in three separate thirds of the storm (random order)."""
    names = ["kill_engine", "kill_compile_worker", "burst"]
    rng.shuffle(names)
    third = seconds / 3
    return [(i * third + rng.uniform(0.1, 0.5) * third, n) for i, n in enumerate(names)]


async def run(args, server: ServerProc) -> dict:
    storm = Storm(args, server)
    t = Traffic(server.url, KEY, args.max_tokens, storm.rng)
    ROUTES_NEEDING_KEY[:] = routes_needing_key()
    control = (args.control_minutes if args.control_minutes is not None else min(args.minutes, 4.0)) * 60
    seconds = args.minutes * 60
    try:
        for kind in HONEST_KINDS:  # warm up: compile caches, first-request costs
            await t.honest(kind, "warmup")
        await storm.phase_run(t, "control", control / 2)
        baseline_info = await asyncio.to_thread(server.info)
        baseline = {"kv_used": baseline_info["kv_pool"]["used"], "radix_cached": baseline_info["kv_pool"]["cached"],
                    "running": baseline_info.get("num_running_reqs"), "rss_server_mb": rss_mb(server.proc.pid)}
        sched = fault_schedule(storm.rng, seconds)
        faults = [storm.faults(t, sched)]
        until = time.monotonic() + seconds
        idle = asyncio.ensure_future(storm.idle_connections(args.idle_connections, until))
        rss = asyncio.ensure_future(storm.sample_rss(min(60.0, seconds / 6), until))
        await storm.phase_run(t, "storm", seconds, args.hostile_rate, faults)
        idle_result = await idle
        rss.cancel()
        drained = await storm.drain(t, baseline)
        after = await asyncio.to_thread(server.info)
        await storm.phase_run(t, "control_after", control / 2)
    finally:
        await t.close()
    info = await asyncio.to_thread(server.info)
    shutdown = server.sigterm(args.graceful_shutdown_timeout + 5)
    return {"args": vars(args), "fates": storm.fates, "hostile": storm.hostile, "events": storm.events,
            "rss": storm.rss, "baseline": baseline, "drained": drained, "idle_connections": idle_result,
            "engine_restarts": info.get("engine_restarts"), "audit": after.get("audit"),
            "refused_opens": (after.get("grammar") or {}).get("refused_opens"), "shutdown": shutdown}


def routes_needing_key() -> list[tuple[str, str]]:
    """Every (method, path) the server routes, from its own table, except the documented open ones."""
    from sglpy.runtime.server.app import build_app
    from sglpy.runtime.server.config import ServerConfig
    from sglpy.runtime.server.console_routes import OPEN_PATHS
    from sglpy.runtime.server.engine_client import EngineClient
    from sglpy.runtime.server.state import ServerState

    cfg = ServerConfig(api_key=KEY)
    app = build_app(ServerState(cfg, EngineClient(cfg.engine_factory, {})))
    out = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource else {}
        path = info.get("path") or info.get("formatter", "").replace("{model:.+}", "x").replace("{model}", "x")
        path = path.replace("{rid}", "x").replace("{name}", "x")
        if route.method in ("GET", "POST", "PUT") and path not in ("/health",) + OPEN_PATHS:
            out.add((route.method, path))
    return sorted(out)


def machine() -> str:
    """CPU model, cores, the ISA flags that matter here, and the load average (the box may be shared)."""
    model, flags = "unknown CPU", set()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model == "unknown CPU":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    isa = [x for x in ("avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile")
           if x in flags]
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{os.cpu_count()} vCPU {model} ({', '.join(isa)}), load average at the end {load}"


def main(argv=None) -> int:
    args = parse_args(argv)
    log_path = os.path.abspath((args.json or "storm") + ".server.log")
    server = ServerProc(args, log_path)
    try:
        startup_s = server.wait_healthy(600)
        print(f"server up in {startup_s:.1f} s: {' '.join(server.cmd[3:])}", flush=True)
        standby_s = server.wait_standby_idle()
        print(f"standby engine process idle after {standby_s} s more", flush=True)
        result = asyncio.run(run(args, server))
    finally:
        server.kill()
    result["startup_s"] = round(startup_s, 1)
    result["standby_ready_s"] = standby_s
    summary = report(result)
    failed = targets(result)
    summary["failed_targets"] = failed
    summary["missed_timing_targets"] = timing_misses(result)
    print(json.dumps(summary, indent=1))
    rows = markdown(summary, machine())
    print(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
        with open(os.path.splitext(args.json)[0] + ".md", "w") as f:  # benchmarks/README.md's storm rows
            f.write(rows)
    if failed:
        print("FAILED:\n  " + "\n  ".join(failed))
    return 1 if failed and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
