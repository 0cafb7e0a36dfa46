"""The parent's end of a ``jaxmoe bench ab`` worker (:mod:`jaxmoe.bench.ab_worker`): the
process on one source tree, its pipe of JSON lines, its log.

A reply of ``{"ok": false}`` (the case raised in that tree) is a :class:`CaseFailed`: the worker
lives on and takes the next case. A worker that exits, or gives no reply within ``timeout_s``
(a kernel hung in Mosaic GPU's interpreter, say), is a :class:`WorkerDied`: it is ended and
:meth:`WorkerProcess.restart` starts a fresh one on the same tree.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from jaxmoe.bench.ab_trees import SourceTree

WORKER_SCRIPT = Path(__file__).with_name("ab_worker.py")


class CaseFailed(RuntimeError):
    """The worker's tree raised on a command; ``str()`` is its error."""


class WorkerDied(RuntimeError):
    """The worker exited or stopped answering; ``str()`` says how, with its log's tail."""


AUTOTUNE_FLAG = "--xla_gpu_per_fusion_autotune_cache_dir"


def worker_env(tree: SourceTree, mem_fraction: float, autotune_dir: Path) -> dict[str, str]:
    """The parent's environment with ``PYTHONPATH`` the tree's ``src`` alone (the parent's own
    ``src`` must not shadow it) and JAX's GPU memory shared: each worker grows its pool up to
    ``mem_fraction`` of the device instead of taking 75% at start.

    Both workers share one XLA autotuning cache (unless ``XLA_FLAGS`` names one already): a
    fusion the two trees compile alike then gets the same kernel config in both, where two
    autotuning runs, timing candidates on a busy GPU, could pick different ones (other bits).
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree.src)
    if AUTOTUNE_FLAG not in env.get("XLA_FLAGS", ""):
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {AUTOTUNE_FLAG}={autotune_dir}".strip()
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = f"{mem_fraction:g}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


class WorkerProcess:
    """One worker: ``request(command)`` sends a JSON line and returns the reply's fields."""

    def __init__(self, tree: SourceTree, log_dir: Path, *, mem_fraction: float, timeout_s: float):
        self.tree, self.timeout_s, self.mem_fraction = tree, timeout_s, mem_fraction
        self.log_path = Path(log_dir) / f"{tree.label}-worker.log"
        self.process: subprocess.Popen | None = None
        self.replies: queue.Queue = queue.Queue()
        self.info: dict[str, Any] = {}
        self.log_mark = 0  # the log's length when the last command was sent

    def start(self) -> None:
        """Starts the process and sends ``hello`` (the reply: :meth:`finish_start`)."""
        self.replies = queue.Queue()
        log = open(self.log_path, "a")  # noqa: SIM115 - the child holds it; closed below
        try:
            # -P: the script's folder (jaxmoe/bench, whose timing.py and layer.py are no
            # top-level modules) stays off sys.path; the cwd is the log folder for the same reason.
            self.process = subprocess.Popen(
                [sys.executable, "-P", str(WORKER_SCRIPT)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                cwd=self.log_path.parent,
                env=worker_env(self.tree, self.mem_fraction, self.log_path.parent / "autotune"),
                text=True,
                bufsize=1,
            )
        finally:
            log.close()
        threading.Thread(target=self._read, args=(self.process, self.replies), daemon=True).start()
        self.send({"op": "hello"})

    def finish_start(self) -> dict[str, Any]:
        """``hello``'s reply; WorkerDied unless jaxmoe imported, from the tree's ``src``."""
        try:
            self.info = self.receive()
        except CaseFailed as error:
            self.close()
            label = self.tree.label
            raise WorkerDied(f"the {label} worker could not import jaxmoe: {error}") from None

        imported = Path(self.info["jaxmoe_file"]).resolve()
        if not imported.is_relative_to(self.tree.src.resolve()):
            self.close()
            raise WorkerDied(
                f"the {self.tree.label} worker imported jaxmoe from {imported}, not from "
                f"{self.tree.src}: something ahead of PYTHONPATH (a .pth file?) shadows the tree"
            )
        return self.info

    def restart(self) -> dict[str, Any]:
        self.close()
        self.start()
        return self.finish_start()

    @staticmethod
    def _read(process: subprocess.Popen, replies: queue.Queue) -> None:
        for line in process.stdout:
            replies.put(line)
        replies.put(None)  # end of output: the process is gone

    def send(self, command: dict[str, Any]) -> None:
        self.log_mark = self.log_path.stat().st_size if self.log_path.exists() else 0
        try:
            self.process.stdin.write(json.dumps(command) + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise self._died("exited before it could take the command") from None

    def receive(self) -> dict[str, Any]:
        """The next reply's fields; CaseFailed for ``ok: false``, WorkerDied for no reply."""
        try:
            line = self.replies.get(timeout=self.timeout_s)
        except queue.Empty:
            self.close()
            raise self._died(f"gave no reply in {self.timeout_s:g} s (ended)") from None
        if line is None:
            raise self._died(f"exited (status {self.process.wait()})")
        try:
            reply = json.loads(line)
        except json.JSONDecodeError:
            raise self._died(f"wrote a line that is not JSON: {line[:200]!r}") from None
        if not reply.pop("ok", False):
            raise CaseFailed(reply.get("error") or "failed (no error given)")
        return reply

    def request(self, command: dict[str, Any]) -> dict[str, Any]:
        self.send(command)
        return self.receive()

    def log_tail(self, lines: int = 8) -> str:
        """The last ``lines`` the worker logged since the last command was sent, on one line."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self.log_mark)
                text = log.read().decode(errors="replace")
        except OSError:
            return ""
        return " | ".join(line for line in text.strip().splitlines()[-lines:] if line.strip())

    def _died(self, how: str) -> WorkerDied:
        tail = self.log_tail()
        return WorkerDied(f"{self.tree.label} worker {how}" + (f"; log: {tail}" if tail else ""))

    def close(self) -> None:
        """Asks the worker to quit; ends it if it does not within a few seconds."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        try:
            process.stdin.write(json.dumps({"op": "quit"}) + "\n")
            process.stdin.flush()
            process.wait(timeout=10)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()
