"""One tensor-parallel rank's process (`python -m sglpy.runtime.model.tp_rank SPEC`, started by tp_worker.LocalRanks).

A worker joins the group at dist_init_addr, loads its shard and KV pool, reports a startup fingerprint (rank 0
checks every rank agrees), then runs one forward per StepMessage until STOP. It ends when its parent process
ends (stdin closes), on STOP, or when the group breaks (a peer died: gloo reports the closed connection; a hung
peer: dist_timeout).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from .tp_worker import WorkerSpec, rank_device

logger = logging.getLogger("sglpy.tp")


def _watch_parent() -> None:
    """End this rank when its parent goes away (stdin reaches EOF)."""
    try:
        sys.stdin.buffer.read()
    finally:
        os._exit(0)


def worker_main(spec: WorkerSpec) -> int:
    """Join the group, load this rank's shard, run forwards until STOP; the exit code tells how it ended."""
    import torch

    from .parallel import init_group
    from .runner import ModelRunner, kv_buffers_for
    from .tp_step import STOP, StepMessage

    torch.set_num_threads(spec.threads)
    cfg = spec.engine
    device = rank_device(cfg, spec.local_rank)
    group = init_group(spec.rank, cfg.tp_size, spec.addr, cfg.dist_timeout, device)
    try:
        runner = ModelRunner(cfg, spec.model_path, group=group)  # checks startup agreement with rank 0
        kv = kv_buffers_for(runner, cfg)
        with torch.inference_mode():
            while True:
                msg = StepMessage.receive(group)
                if msg.kind == STOP:
                    return 0
                msg.apply_row_updates(kv.req_to_token)
                runner.model(msg.batch(kv.req_to_token, device), kv)
    finally:
        group.destroy()


def main(argv: list[str]) -> int:
    """Process entry point: one rank from its JSON spec."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # like the engine: stopped by rank 0, its parent, or the group
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    spec = WorkerSpec.from_json(argv[0])
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s tp-rank{spec.rank} %(levelname)s %(message)s")
    threading.Thread(target=_watch_parent, daemon=True, name="tp-parent-watch").start()
    try:
        return worker_main(spec)
    except Exception as e:  # noqa: BLE001 - reported here; rank 0 sees the group fail
        logger.error("rank %d failed: %s: %s", spec.rank, type(e).__name__, e)
        return 1


if __name__ == "__main__":
    code = main(sys.argv[1:])
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # not sys.exit: the parent-watch thread holds stdin, which interpreter shutdown would wait for
