"""The verifier worker process: ``python -m dapo_exp.tasks.verify_worker``.

Started by :class:`dapo_exp.tasks.verify_pool.WorkerPool`; imports the scorers of
:mod:`dapo_exp.tasks.verifier` once (and ``math_verify`` when asked), then answers
JSON-line requests ``{"i", "kind", "response", "answer"}`` on stdin with
``{"i", "correct", "pred"[, "error"]}`` on stdout. Its own module so that the pool
(imported by the verifier) and the worker (which imports the verifier) form no cycle.
"""

from __future__ import annotations

import json
import os
import sys


def _die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this worker when its parent dies (best effort)."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except Exception:
        pass


def _limit_memory(mb: int) -> None:
    try:
        import resource

        limit = mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except Exception:
        pass


def _worker_main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="dapo_exp verifier worker (speaks JSON lines on stdin/stdout)")
    ap.add_argument("--preload", default="")
    ap.add_argument("--memory-limit-mb", type=int, default=0)
    ap.add_argument("--die-with-parent", action="store_true")
    args = ap.parse_args(argv)

    # the protocol gets a private copy of stdout; whatever a library prints goes to stderr
    proto = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    if args.die_with_parent:
        _die_with_parent()

    def send(obj: dict) -> None:
        proto.write((json.dumps(obj) + "\n").encode("ascii"))

    try:
        from dapo_exp.tasks.verifier import SCORERS, preload_scorer

        for kind in filter(None, args.preload.split(",")):
            preload_scorer(kind)
    except BaseException as exc:  # noqa: BLE001  (report, then exit)
        send({"ready": False, "error": f"{type(exc).__name__}: {exc}"})
        return 1
    if args.memory_limit_mb:
        _limit_memory(args.memory_limit_mb)
    send({"ready": True})

    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline()
        if not line:
            return 0  # parent closed the pipe
        i = None
        try:
            req = json.loads(line)
            i = req["i"]
            correct, pred = SCORERS[req["kind"]](req["response"], req["answer"])
            out = {"i": i, "correct": bool(correct), "pred": pred}
        except BaseException as exc:  # noqa: BLE001  (MemoryError, RecursionError, parser bugs: all "wrong")
            out = {"i": i, "correct": False, "pred": None, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        try:
            send(out)
        except BaseException:  # noqa: BLE001
            return 1


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
