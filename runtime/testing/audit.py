"""AuditedEngine: the runtime Engine plus an audit hook that records what the engine process touches after startup.

`sglpy serve --engine-factory sglpy.runtime.testing.audit:AuditedEngine` serves it. Once the model is
loaded, every file open (other than Python code imported lazily, and the compile workers' /proc CPU-time
reads), socket connection and process launch is recorded; `get_server_info()["audit"]` lists them and
`["grammar"]["refused_opens"]` counts what the sandboxed compile workers refused. Tests send hostile
requests and check both stay empty: no request field reaches the filesystem or the network.
"""

from __future__ import annotations

import os
import re
import sys

CODE = (".py", ".pyc", ".so")
PROC_STAT = re.compile(r"^/proc/\d+/stat$")  # GrammarService reads its workers' CPU time
EVENTS = ("socket.connect", "socket.getaddrinfo", "os.system", "os.exec", "os.posix_spawn", "os.spawn")


def preload(model=None, **kwargs) -> None:
    """The runtime engine's preload (a standby engine process runs it before it waits)."""
    from sglpy.runtime.engine import preload as engine_preload

    engine_preload(model, **kwargs)


def AuditedEngine(model=None, **kwargs):
    """Build the runtime Engine, then start recording (a factory: the Engine class is imported here, with torch)."""
    from sglpy.runtime.engine import Engine

    class _Audited(Engine):
        def __init__(self):
            super().__init__(model, **kwargs)
            self.audit_log: list[str] = []
            workers = {os.path.realpath(sys.executable)}
            sys.addaudithook(lambda event, args: self._audit(event, args, workers))

        def _audit(self, event: str, args: tuple, workers: set) -> None:
            if event == "open":
                path = os.fsdecode(args[0]) if isinstance(args[0], (str, bytes)) else repr(args[0])
                if not path.endswith(CODE) and not PROC_STAT.match(path) and path != os.devnull:  # worker stdin
                    self.audit_log.append(f"open {path}")
            elif event == "subprocess.Popen":
                exe = os.path.realpath(os.fsdecode(args[0])) if args[0] is not None else ""
                cmd = [os.fsdecode(a) for a in (args[1] or [])]
                if exe not in workers or "sglpy.runtime.engine.grammar_worker" not in " ".join(cmd):  # a worker restart
                    self.audit_log.append(f"{event} {cmd}")
            elif event in EVENTS:
                self.audit_log.append(f"{event} {args[:2]!r}")

        def get_server_info(self) -> dict:
            info = super().get_server_info()
            info["audit"] = list(self.audit_log)
            return info

    return _Audited()
