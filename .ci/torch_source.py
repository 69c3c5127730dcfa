"""Where a CPU machine gets PyTorch's CPU build from: pick the source, say which, refuse a CUDA build.

    python .ci/torch_source.py [--spec torch==2.13.0]

Run with the interpreter of the environment to install into (it asks that environment's pip).
Tries, in order, until one of them would install a CPU build of ``--spec``:

1. ``$DAPO_TORCH_SOURCE``, when set: the user's CPU wheel source, an index URL (a mirror of
   https://download.pytorch.org/whl/cpu) or a directory of wheels (``--find-links``); only it is tried;
2. pip's configured sources as they are (``pip config list``, ``PIP_*`` variables: a find-links
   directory or an index that serves a CPU wheel, as on this project's CI machines; PyPI on macOS);
3. PyTorch's CPU wheel index, https://download.pytorch.org/whl/cpu (``--extra-index-url``).

Each is asked with ``pip install --dry-run --no-deps --report`` (metadata only: nothing of the
wheel's gigabytes is downloaded from an index that serves PEP 658 metadata, PyPI and PyPI-like
indexes do), and the wheel pip would pick is classified by :func:`classify`: ``+cpu`` in its
version or file name, or no ``nvidia-*`` dependency for this platform, is a CPU build; ``+cuXXX`` /
``+rocm`` or an ``nvidia-*`` dependency is a GPU build. A wheel that does not come from the source asked
(pip's ``--extra-index-url`` falls back to the default index) is not that source's: the source is said to be
unreachable, with pip's own reason, or to serve no such build, never to offer only a CUDA build. The pip arguments of the first CPU source are
printed on stdout, one per line (nothing when pip's configured sources do); what was chosen and why
goes to stderr. When no source gives a CPU build it says so loudly and exits 3, before anything
is downloaded, unless ``DAPO_TORCH_ALLOW_CUDA=1`` (then the first source that resolves is taken).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import urllib.parse
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
DEFAULT_SPEC = "torch==2.13.0"
REFUSED = 3


def source_args(source: str) -> list[str]:
    """pip arguments for a user's source: a URL is an extra index, anything else a find-links location."""
    if source.startswith(("http://", "https://")):
        return ["--extra-index-url", source]
    return ["--find-links", source]


def candidates(env: dict | None = None) -> list[tuple[str, list[str]]]:
    """``(description, pip args)`` of each source to try, in order."""
    env = os.environ if env is None else env
    user = env.get("DAPO_TORCH_SOURCE", "").strip()
    if user:
        return [(f"DAPO_TORCH_SOURCE={user}", source_args(user))]
    return [("pip's configured sources (pip config list, PIP_* variables)", []),
            (f"PyTorch's CPU wheel index {CPU_INDEX}", ["--extra-index-url", CPU_INDEX])]


def _requires_nvidia(requires: list[str]) -> list[str]:
    """The ``nvidia-*`` requirements that apply on this machine (markers evaluated when pip's packaging is
    importable; otherwise every one counts)."""
    try:  # the packaging library first: importing pip turns off setuptools' distutils shim for the whole
        # process (a later `import setuptools` then fails on the stdlib distutils: trl, vLLM in the tests)
        from packaging.requirements import Requirement
    except ImportError:
        try:
            from pip._vendor.packaging.requirements import Requirement  # the system Python of .ci/install
        except ImportError:  # pragma: no cover - pip always vendors it
            Requirement = None
    out = []
    for text in requires:
        name = text.split(";")[0].strip().lower()
        if not name.startswith("nvidia-"):
            continue
        if Requirement is not None:
            try:
                req = Requirement(text)
                if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                    continue
            except Exception:  # noqa: BLE001 - an unparsable line counts
                pass
        out.append(name.split()[0])
    return out


def classify(item: dict) -> tuple[str, str]:
    """``("cpu" | "gpu", what)`` for one entry of ``pip install --report``'s ``install`` list."""
    meta = item.get("metadata") or {}
    version = str(meta.get("version", ""))
    url = (item.get("download_info") or {}).get("url", "")
    filename = urllib.parse.unquote(url.rsplit("/", 1)[-1]) if url else "?"
    where = url.rsplit("/", 1)[0] if "/" in url else ""  # where pip takes it from (a find-links folder, an index)
    what = f"torch {version} ({filename}{f', from {where}' if where else ''})"
    local = version.partition("+")[2].lower() or (filename.split("-")[1].partition("+")[2].lower()
                                                  if filename.count("-") >= 2 else "")
    if local.startswith("cpu"):
        return "cpu", what
    if local.startswith(("cu", "rocm", "xpu")):
        return "gpu", what
    nvidia = _requires_nvidia(list(meta.get("requires_dist") or []))
    if nvidia:
        return "gpu", f"{what}, needs {', '.join(nvidia[:3])}{', ...' if len(nvidia) > 3 else ''}"
    return "cpu", what


def source_of(args: list[str]) -> str | None:
    """The URL or directory a candidate's pip arguments name (None: pip's configured sources)."""
    return args[1] if len(args) == 2 else None


def served_by(item: dict, source: str) -> bool:
    """Whether the wheel of a report entry comes from ``source``: an index on the same host, or a file in the
    directory (a wheel pip found elsewhere, such as the default index beside an unreachable extra one, is not)."""
    url = (item.get("download_info") or {}).get("url", "")
    if source.startswith(("http://", "https://")):
        return urllib.parse.urlsplit(url).netloc == urllib.parse.urlsplit(source).netloc
    path = urllib.parse.unquote(urllib.parse.urlsplit(url).path) if url.startswith("file:") else url
    return os.path.abspath(path).startswith(os.path.abspath(os.path.expanduser(source)).rstrip("/") + "/")


def pips_reason(stderr: str, source: str | None) -> str:
    """pip's own words about ``source`` (its last warning naming the source's host or path: a refused
    connection, an unknown host, an HTTP error), or "". ``source`` None (pip's configured sources): its last
    warning that a connection failed, whatever the host."""
    if source is None:
        said = [ln.strip() for ln in stderr.splitlines() if ln.lstrip().startswith("WARNING") and any(
            m in ln for m in ("Connection", "connection", "resolution", "Name or service", "timed out", "Proxy",
                              "SSL", "Max retries"))]
    else:
        parts = urllib.parse.urlsplit(source)
        marks = [m for m in (parts.netloc, parts.path.rstrip("/") or None, source) if m]
        said = [ln.strip() for ln in stderr.splitlines() if any(m in ln for m in marks)]
    return " ".join(said[-1].removeprefix("WARNING:").split())[:400] if said else ""


def configured_index(python: str, env: dict) -> str:
    """The index pip's configured sources start from: PIP_INDEX_URL, else pip's ``global.index-url``, else PyPI."""
    if env.get("PIP_INDEX_URL", "").strip():
        return env["PIP_INDEX_URL"].strip()
    out = subprocess.run([python, "-m", "pip", "config", "get", "global.index-url"], capture_output=True, text=True)
    url = out.stdout.strip() if out.returncode == 0 else ""
    return url or "https://pypi.org/simple"


def dry_run(python: str, spec: str, args: list[str]) -> tuple[dict | None, str]:
    """What ``pip install spec args`` would install: (the report's torch entry, pip's warnings) or (None, the
    error)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [python, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet",
               "--disable-pip-version-check", "--retries", "1", "--report", str(report), spec, *args]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0 or not report.is_file():  # all of pip's words: its warnings say why, its last line what
            text = (out.stderr or out.stdout).strip()
            return None, text or f"pip exited {out.returncode}"
        entries = json.loads(report.read_text()).get("install") or []
    torch = [e for e in entries if str((e.get("metadata") or {}).get("name", "")).lower() == "torch"]
    return (torch[0], out.stderr or "") if torch else (None, "pip would install no torch")


def choose(python: str, spec: str, env: dict | None = None) -> tuple[list[str] | None, list[str]]:
    """(the pip args of the first CPU source or None, the lines saying what each source gave)."""
    env = os.environ if env is None else env
    allow_gpu = env.get("DAPO_TORCH_ALLOW_CUDA", "0") == "1"
    said, first_gpu = [], None
    for what, args in candidates(env):
        item, error = dry_run(python, spec, args)
        source = source_of(args)
        if not args:  # pip's configured sources: name where they start
            what = f"{what}, from {configured_index(python, env)}"
        if item is None:
            last = ([ln.strip() for ln in error.splitlines() if ln.strip()] or [error])[-1]
            reason = pips_reason(error, source)
            said.append(f"{what}: unreachable (pip: {reason}); pip found no {spec} ({last})" if reason
                        else f"{what}: no {spec} ({last})")
            continue
        kind, wheel = classify(item)
        if kind == "gpu" and source is not None and not served_by(item, source):  # pip took it from elsewhere
            reason = pips_reason(error, source)
            said.append(f"{what}: unreachable (pip: {reason}); pip would take {wheel} from another source" if reason
                        else f"{what}: serves no {spec}; pip would take {wheel} from another source")
            continue
        if kind == "cpu":
            said.append(f"{what}: CPU build {wheel}: chosen")
            return args, said
        said.append(f"{what}: only a CUDA/GPU build, {wheel}")
        first_gpu = first_gpu or (args, wheel, what)
    if allow_gpu and first_gpu is not None:
        said.append(f"DAPO_TORCH_ALLOW_CUDA=1: installing the GPU build {first_gpu[1]} from {first_gpu[2]}")
        return first_gpu[0], said
    return None, said


def refusal(spec: str, said: list[str]) -> str:
    """The refusal, saying what each source gave; the fixes that can work (PyTorch's CPU index only when it was
    not found unreachable)."""
    bar = "!" * 100
    index_down = any(line.startswith(f"PyTorch's CPU wheel index {CPU_INDEX}: unreachable") for line in said)
    gpu_seen = any("CUDA/GPU build" in line or "would take" in line for line in said)
    headline = (f"!!! NO CPU BUILD OF {spec} IS REACHABLE: refusing to install (a CUDA build is several GB of wheels)"
                if gpu_seen else f"!!! NO BUILD OF {spec} IS REACHABLE from any source tried (none resolved: "
                "unreachable, or without it): refusing to install")
    allow = (["!!! or, to install the CUDA build anyway: DAPO_TORCH_ALLOW_CUDA=1 bash .ci/install"] if gpu_seen else
             ["!!! (no source gave a CUDA build either: check this machine's network and pip's configured index, "
              "or use a directory of wheels)"])
    index = ([f"!!!   DAPO_TORCH_SOURCE=https://<your mirror of {CPU_INDEX}> bash .ci/install",
              f"!!!   (the index itself is unreachable from here; where it is reachable: pip download --no-deps "
              f"{spec} --index-url {CPU_INDEX} -d wheels/, then copy wheels/ here)"] if index_down else
             [f"!!!   DAPO_TORCH_SOURCE={CPU_INDEX} bash .ci/install      (PyTorch's CPU index, or your mirror of it)"])
    return "\n".join([
        bar,
        headline,
        *[f"!!!   {line}" for line in said],
        "!!! Point the install at a CPU wheel source and run it again:",
        "!!!   DAPO_TORCH_SOURCE=/path/to/wheels bash .ci/install   (a directory holding torch-<ver>+cpu-*.whl)",
        *index,
        *allow,
        bar,
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--spec", default=DEFAULT_SPEC, help=f"the torch requirement (default {DEFAULT_SPEC})")
    parser.add_argument("--python", default=sys.executable, help="the environment's interpreter (default: this one)")
    a = parser.parse_args(argv)
    args, said = choose(a.python, a.spec)
    if args is None:
        print(refusal(a.spec, said), file=sys.stderr)
        return REFUSED
    for line in said:
        print(f"torch source: {line}", file=sys.stderr)
    print("\n".join(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
