"""A small pool of verifier worker *subprocesses* with a hard per-task time limit.

Why this and not ``concurrent.futures.ProcessPoolExecutor`` or ``multiprocessing``:

- A hung task must be stopped without losing the others. ``ProcessPoolExecutor`` cannot
  cancel a running future; the only way out is to kill the whole pool (which breaks it,
  ``BrokenProcessPool``, and loses the tasks of every other worker). Here each worker is
  its own ``subprocess.Popen``; the one that overruns is SIGKILLed and replaced, the
  others keep going.
- It must work wherever the trainer calls it: from any thread (the limit is enforced by
  the parent waiting on pipes with ``poll``, no ``signal.alarm``, which only works in the
  main thread) and from inside daemonic worker processes (``multiprocessing`` refuses
  to start children there; ``subprocess`` does not).
- No fork of the trainer (a forked copy of a process holding CUDA state or torch's thread
  pools can deadlock) and no re-import of the trainer's ``__main__`` (what ``spawn`` and
  ``forkserver`` do): a worker is a fresh ``python -m dapo_exp.tasks.verify_worker`` that
  imports only the verifier (and, when asked, ``math_verify``) once, then serves tasks.
- Messages are JSON lines (ASCII-escaped, so a response with newlines, NULs or lone
  surrogates cannot break the framing); nothing received is unpickled or evaluated.

Each worker caps its own address space (``RLIMIT_AS``, 4 GiB, after its imports) so that
a runaway big-number computation fails with ``MemoryError`` instead of eating the machine,
and sends whatever the libraries print to stderr (discarded unless
``DAPO_VERIFY_WORKER_STDERR=1``). An idle worker exits when the parent closes its stdin
(the parent's exit); workers started from the main thread also ask the kernel to kill them
if the parent dies (``PR_SET_PDEATHSIG``, Linux), so a worker busy on a hung task is not
orphaned. ``atexit`` kills them all on a normal exit.

Time bound of :meth:`WorkerPool.run`: each task gets ``timeout_s`` from the moment it is
handed to a ready worker; a worker that has not answered by then is killed and the task
reported as timed out. Tasks queue when there are more than workers, so a batch of N
tasks on W workers returns within about ``ceil(N / W) * timeout_s`` plus worker start-up
(``startup_timeout_s`` at most, paid once, and again after a kill).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

# the directory holding the `dapo_exp` package (put on the workers' PYTHONPATH)
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# a task whose worker crashed (EOF, not a timeout) is retried this many times in total
_MAX_ATTEMPTS = 2


class WorkerResult(NamedTuple):
    """Outcome of one task: ``correct``/``pred`` from the scorer, or a timeout or error."""

    correct: bool
    pred: str | None
    timed_out: bool = False
    error: str | None = None


@dataclass
class _Worker:
    proc: subprocess.Popen
    started: float  # time.monotonic() at launch
    ready: bool = False
    task: int | None = None  # index of the task it is running
    t0: float = 0.0  # when that task was handed over
    buf: bytes = b""


_LIVE_POOLS: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for pool in list(_LIVE_POOLS):
        pool.close()


class _Call:
    """The bookkeeping of one :meth:`WorkerPool.run` call."""

    def __init__(self, tasks: Sequence[tuple[str, str, str]], timeout_s: float) -> None:
        self.tasks, self.timeout_s = tasks, timeout_s
        self.results: list[WorkerResult | None] = [None] * len(tasks)
        self.queue = deque(range(len(tasks)))
        self.attempts = [0] * len(tasks)
        self.startup_failures = 0

    def finish(self, i: int, res: WorkerResult) -> None:
        if self.results[i] is None:
            self.results[i] = res

    def filled(self, default: WorkerResult) -> list[WorkerResult]:
        """The results, ``default`` for every task that has none."""
        return [r if r is not None else default for r in self.results]


class WorkerPool:

    """``n_workers`` verifier subprocesses; :meth:`run` scores tasks with a per-task time limit.

    A task is ``(kind, response, answer)``; ``kind`` names a scorer of
    ``dapo_exp.tasks.verifier.SCORERS``. Workers start on first use and live until
    :meth:`close` (or interpreter exit). Thread-safe: concurrent calls take turns.
    """

    def __init__(
        self,
        n_workers: int,
        preload: Sequence[str] = (),
        startup_timeout_s: float = 60.0,
        memory_limit_mb: int | None = 4096,
    ) -> None:
        if n_workers < 1:
            raise ValueError(f"n_workers must be >= 1, got {n_workers}")
        self.n_workers = n_workers
        self.preload = tuple(preload)
        self.startup_timeout_s = startup_timeout_s
        self.memory_limit_mb = memory_limit_mb
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._broken: str | None = None  # set when workers cannot start at all
        self.n_killed = 0  # workers killed for overrunning (for tests and logs)
        _LIVE_POOLS.add(self)

    # ----------------------------------------------------------------- workers
    def _spawn(self) -> _Worker:
        env = dict(os.environ)
        env["PYTHONPATH"] = _PACKAGE_PARENT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env[var] = "1"
        cmd = [sys.executable, "-m", "dapo_exp.tasks.verify_worker", "--preload", ",".join(self.preload)]
        if self.memory_limit_mb:
            cmd += ["--memory-limit-mb", str(self.memory_limit_mb)]
        # the kernel's parent-death signal fires when the *thread* that started the child
        # exits, so ask for it only from the main thread (whose end is the process's end)
        if threading.current_thread() is threading.main_thread():
            cmd += ["--die-with-parent"]
        show_stderr = os.environ.get("DAPO_VERIFY_WORKER_STDERR") == "1"
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None if show_stderr else subprocess.DEVNULL,
            cwd=_PACKAGE_PARENT,
            env=env,
            close_fds=True,
            start_new_session=True,  # a Ctrl-C in the terminal reaches the trainer, not the workers
        )
        return _Worker(proc=proc, started=time.monotonic())

    @staticmethod
    def _kill(w: _Worker) -> None:
        try:
            w.proc.kill()
            w.proc.wait(timeout=5)
        except Exception:  # already gone
            pass
        for stream in (w.proc.stdin, w.proc.stdout):
            try:
                stream.close()
            except Exception:
                pass

    def _replace(self, w: _Worker) -> None:
        self._kill(w)
        self._workers[self._workers.index(w)] = self._spawn()

    def start(self) -> None:
        """Launch the workers now (they import in the background); :meth:`run` does it lazily."""
        with self._lock:
            self._start_locked()

    def _start_locked(self) -> None:
        while len(self._workers) < self.n_workers:
            self._workers.append(self._spawn())

    def close(self) -> None:
        """Kill every worker. The pool restarts them if :meth:`run` is called again."""
        with self._lock:
            for w in self._workers:
                self._kill(w)
            self._workers = []

    # --------------------------------------------------------------------- run
    def run(self, tasks: Sequence[tuple[str, str, str]], timeout_s: float) -> list[WorkerResult]:
        """Score ``tasks`` (each ``(kind, response, answer)``); one :class:`WorkerResult` per task, in order.

        Never raises for any task content: an overrun is ``timed_out=True``; a crash
        (after one retry) or a pool whose workers cannot start is ``error=...``; both
        count as incorrect.
        """
        if not tasks:
            return []
        with self._lock:
            try:
                return self._run_locked(tasks, timeout_s)
            except Exception as exc:  # a bug here must not take the trainer down
                for w in self._workers:  # no worker may carry a half-done task into the next call
                    self._kill(w)
                self._workers = []
                err = f"verifier pool failure: {type(exc).__name__}: {exc}"
                return [WorkerResult(False, None, False, err) for _ in tasks]

    def _run_locked(self, tasks: Sequence[tuple[str, str, str]], timeout_s: float) -> list[WorkerResult]:
        if self._broken:
            return [WorkerResult(False, None, False, self._broken)] * len(tasks)
        call = _Call(tasks, timeout_s)
        self._start_locked()
        for w in list(self._workers):
            if w.task is not None:  # left busy by an interrupted call (KeyboardInterrupt): start clean
                self._replace(w)
        while True:
            self._dispatch(call)
            if not call.queue and all(w.task is None for w in self._workers):
                break
            self._read_replies(call)
            if self._broken:
                for w in self._workers:
                    self._kill(w)
                self._workers = []
                return call.filled(WorkerResult(False, None, False, self._broken))
            self._enforce_limits(call)
            if call.startup_failures >= 2 * self.n_workers and not any(w.ready for w in self._workers):
                err = f"verifier workers did not start within {self.startup_timeout_s} s"
                return call.filled(WorkerResult(False, None, True, err))
        return call.filled(WorkerResult(False, None, False, "lost"))

    def _dispatch(self, call: _Call) -> None:
        """Hand queued tasks to idle, ready workers."""
        now = time.monotonic()
        for w in list(self._workers):
            if w.ready and w.task is None and call.queue:
                i = call.queue.popleft()
                kind, response, answer = call.tasks[i]
                line = json.dumps({"i": i, "kind": kind, "response": response, "answer": answer}) + "\n"
                try:
                    w.proc.stdin.write(line.encode("ascii"))
                    w.proc.stdin.flush()
                except OSError:  # died while idle: retry the task elsewhere
                    call.queue.appendleft(i)
                    self._replace(w)
                    continue
                w.task, w.t0 = i, now

    def _read_replies(self, call: _Call) -> None:
        """Sleep until a worker speaks or the nearest deadline, then read what the workers said."""
        now = time.monotonic()
        deadlines = [w.t0 + call.timeout_s for w in self._workers if w.task is not None]
        deadlines += [w.started + self.startup_timeout_s for w in self._workers if not w.ready]
        wait_s = max(0.0, min(deadlines) - now) if deadlines else 0.0
        poller = select.poll()
        by_fd = {}
        for w in self._workers:
            fd = w.proc.stdout.fileno()
            by_fd[fd] = w
            poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        for fd, _ in poller.poll(wait_s * 1000.0 + 1.0):
            w = by_fd[fd]
            chunk = os.read(fd, 1 << 16)
            if not chunk:  # EOF: the worker died (crash, OOM kill)
                if not w.ready:
                    call.startup_failures += 1
                if w.task is not None:
                    i = w.task
                    call.attempts[i] += 1
                    if call.attempts[i] < _MAX_ATTEMPTS:
                        call.queue.appendleft(i)
                    else:
                        call.finish(i, WorkerResult(False, None, False, "verifier worker crashed"))
                self._replace(w)
                continue
            w.buf += chunk
            while b"\n" in w.buf:
                raw, w.buf = w.buf.split(b"\n", 1)
                self._handle_message(w, raw, call)

    def _handle_message(self, w: _Worker, raw: bytes, call: _Call) -> None:
        try:
            msg = json.loads(raw)
        except ValueError:  # not ours (cannot happen: library output goes to stderr)
            return
        if not isinstance(msg, dict):
            return
        if "ready" in msg:
            if msg["ready"]:
                w.ready = True
            else:
                self._broken = f"verifier workers cannot start: {msg.get('error')}"
        elif w.task is not None and msg.get("i") == w.task:
            call.finish(w.task, WorkerResult(bool(msg["correct"]), msg.get("pred"), False, msg.get("error")))
            w.task = None

    def _enforce_limits(self, call: _Call) -> None:
        """Kill a worker past its task's deadline (the task times out) or its start-up limit."""
        now = time.monotonic()
        for w in list(self._workers):
            if w.task is not None and now - w.t0 >= call.timeout_s:
                call.finish(w.task, WorkerResult(False, None, True, f"timed out after {call.timeout_s} s"))
                self.n_killed += 1
                self._replace(w)
            elif not w.ready and now - w.started >= self.startup_timeout_s:
                call.startup_failures += 1
                self._replace(w)
