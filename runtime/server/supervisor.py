"""Engine supervision: restart a dead engine process (bounded retries, backoff) and judge step-loop liveness.

When the engine process dies, EngineClient fails its in-flight requests at once (503) and sets `died`;
`supervise` then starts a new process right away, and after a failed start retries up to
`engine_restart_attempts` times, waiting `engine_restart_backoff` seconds doubled per failure (at most
30 s). An engine that dies again within a minute of a restart also backs off, so a crash loop does not
spin. Once shutdown began (`state.draining`) it starts no engine: a SIGTERM sent to the process group
during a restart kills the engine being started, and that failure can reach the supervisor before its
cancellation does (asyncio.wait_for then raises the start's error, not CancelledError), so the flag is
checked after every wait rather than trusted to the cancel alone. `stall_reason` is what /health reports
when the step loop has work and made no progress for `health_stall_timeout` seconds, or when the engine
process stopped sending heartbeats.
"""

from __future__ import annotations

import asyncio
import logging
import time

from .state import ServerState

logger = logging.getLogger("sglpy.server")

MAX_BACKOFF_S = 30.0
STABLE_S = 60.0  # an engine up this long resets the backoff


def stall_reason(state: ServerState) -> str | None:
    """Why the live engine counts as stalled (for /health), or None when it is making progress or idle."""
    engine, limit = state.engine, state.config.health_stall_timeout
    if not engine.alive or limit <= 0:
        return None
    silent = time.monotonic() - engine.progress_at
    if silent > limit:
        return f"no heartbeat from the engine process for {silent:.0f} s"
    p = engine.progress
    if p is not None and p.busy and p.idle_s > limit:
        return f"the engine step loop made no progress for {p.idle_s:.0f} s with work waiting"
    return None


async def supervise(state: ServerState) -> None:
    """Run until cancelled: after each unexpected engine death, start a new engine process."""
    cfg, engine = state.config, state.engine
    crashes = 0  # deaths without a stable period in between
    while True:
        await engine.died.wait()
        if cfg.engine_restart_attempts == 0 or state.draining:
            return
        up_since = state.engine_started_at
        crashes = crashes + 1 if time.monotonic() - up_since < STABLE_S else 1
        delay = 0.0 if crashes == 1 else min(cfg.engine_restart_backoff * 2 ** (crashes - 2), MAX_BACKOFF_S)
        reason = engine.dead_reason
        for attempt in range(1, cfg.engine_restart_attempts + 1):
            if state.draining:
                state.restarting = None
                return
            state.restarting = f"restarting the engine (attempt {attempt} of {cfg.engine_restart_attempts}) " \
                               f"after: {reason}"
            if delay:
                logger.warning("engine restart in %.1f s (attempt %d)", delay, attempt)
                await asyncio.sleep(delay)
                if state.draining:
                    state.restarting = None
                    return
            t0 = time.monotonic()
            try:
                await engine.start(cfg.engine_startup_timeout)
            except RuntimeError as e:
                logger.error("engine restart attempt %d failed: %s", attempt, e)
                delay = min(max(delay * 2, cfg.engine_restart_backoff), MAX_BACKOFF_S)
                continue
            state.restarting = None
            if state.draining:  # came up as shutdown began: serve() stops it
                return
            state.engine_started_at = time.monotonic()
            state.metrics.engine_restarts.inc()
            state.engine_restarts += 1
            logger.warning("engine restarted in %.1f s (restart %d)", time.monotonic() - t0, state.engine_restarts)
            break
        else:
            state.restarting = None
            engine.dead_reason = f"{reason}; {cfg.engine_restart_attempts} restart attempts failed"
            logger.error("giving up on the engine: %s", engine.dead_reason)
            return
