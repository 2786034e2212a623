"""Tensor-parallel ranks 1..N-1: start them, on the engine's node or a further one (each rank's loop: tp_rank.py).

Rank 0 is the engine process (scheduler, grammar, radix cache, sampling). It starts the other ranks of its
node as `python -m sglpy.runtime.model.tp_rank SPEC` subprocesses; on another node `sglpy serve --nnodes N
--node-rank K` starts that node's ranks (`serve_node`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from ..config import EngineConfig

logger = logging.getLogger("sglpy.tp")


@dataclass(frozen=True)
class WorkerSpec:
    """What one rank needs to join: its rank, the group's address, the engine config and the model folder."""

    rank: int
    local_rank: int
    addr: str
    model_path: str
    threads: int
    engine: EngineConfig

    def to_json(self) -> str:
        """The command-line form."""
        d = dataclasses.asdict(self)
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> "WorkerSpec":
        """Parse the command-line form."""
        d = json.loads(text)
        return cls(**{**d, "engine": EngineConfig(**d["engine"])})


def free_loopback_addr() -> str:
    """127.0.0.1:PORT with a port free right now (one-node groups without dist_init_addr)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def threads_per_rank(cfg: EngineConfig) -> int:
    """torch threads of one rank: num_threads when set, else this machine's cores shared by its ranks."""
    return cfg.num_threads or max(1, (os.cpu_count() or 1) // cfg.ranks_per_node)


class LocalRanks:
    """The worker subprocesses of this node's ranks (started by rank 0, or by `serve_node` on other nodes)."""

    def __init__(self, cfg: EngineConfig, addr: str, model_path: str):
        per = cfg.ranks_per_node
        first = cfg.node_rank * per
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.procs: list[tuple[int, subprocess.Popen]] = []
        for local in range(per):
            rank = first + local
            if rank == 0:
                continue  # the engine process itself
            spec = WorkerSpec(rank, local, addr, model_path, threads_per_rank(cfg), cfg)
            # stdin stays open in the parent: its EOF tells the worker its parent is gone
            proc = subprocess.Popen([sys.executable, "-m", "sglpy.runtime.model.tp_rank", spec.to_json()],
                                    stdin=subprocess.PIPE, env=env)
            self.procs.append((rank, proc))

    def dead(self) -> str | None:
        """Why a rank of this node is gone, or None while all run."""
        for rank, p in self.procs:
            if p.poll() is not None:
                return f"tensor-parallel rank {rank} exited (exit code {p.returncode})"
        return None

    def wait(self, timeout: float | None = None) -> list[int]:
        """Exit codes once every rank ended (None for a rank still running at the timeout)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        codes = []
        for _, p in self.procs:
            try:
                codes.append(p.wait(None if deadline is None else max(deadline - time.monotonic(), 0.01)))
            except subprocess.TimeoutExpired:
                codes.append(None)
        return codes

    def stop(self, timeout: float = 10.0) -> None:
        """Wait up to `timeout` for the ranks to leave (after STOP), then kill what is left."""
        self.wait(timeout)
        for _, p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            if p.stdin:
                p.stdin.close()


def rank_device(cfg: EngineConfig, local_rank: int):
    """This rank's device: cuda:local_rank under CUDA (NCCL), else the CPU."""
    import torch

    if cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    return torch.device("cuda", local_rank)


def serve_node(cfg: EngineConfig, restart_attempts: int = 5, backoff_s: float = 1.0) -> int:
    """`sglpy serve --nnodes N --node-rank K` (K > 0): run this node's ranks; rejoin after rank 0 restarts.

    Ranks that exit 0 were stopped by rank 0 (a clean shutdown): this returns 0. Ranks that fail (the group
    broke: rank 0's engine died, or a peer) are started again to join the next incarnation of the group,
    at most `restart_attempts` times in a row, waiting `backoff_s` doubled per failure (at most 30 s).
    """
    from .loader import resolve_model_path

    model_path = resolve_model_path(cfg.model)
    stopping = threading.Event()
    current: list[LocalRanks] = []

    def on_signal(signum, _frame):
        stopping.set()
        for ranks in current:
            for _, p in ranks.procs:
                if p.poll() is None:
                    p.kill()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    failures, delay = 0, backoff_s
    while not stopping.is_set():
        logger.info("node %d: starting ranks %d..%d, joining %s", cfg.node_rank, cfg.node_rank * cfg.ranks_per_node,
                    (cfg.node_rank + 1) * cfg.ranks_per_node - 1, cfg.dist_init_addr)
        ranks = LocalRanks(cfg, cfg.dist_init_addr, model_path)
        current[:] = [ranks]
        t0 = time.monotonic()
        codes = ranks.wait()
        ranks.stop(0)
        if stopping.is_set():
            return 0
        if all(c == 0 for c in codes):
            logger.info("node %d: rank 0 stopped the group", cfg.node_rank)
            return 0
        failures = 1 if time.monotonic() - t0 > 60 else failures + 1
        if failures > restart_attempts:
            logger.error("node %d: ranks failed %d times in a row (exit codes %s); giving up",
                         cfg.node_rank, failures, codes)
            return 1
        logger.warning("node %d: ranks ended with exit codes %s; rejoining in %.1f s", cfg.node_rank, codes, delay)
        stopping.wait(delay)
        delay = min(delay * 2, 30.0)
    return 0
