"""A failure that would hit every job is refused once, in one line naming the fix, before any job starts.

Issue: a GPU preset sweep without hub access ran all its jobs, each printing a long traceback, then
analysed no run; ``rollout=vllm`` without vLLM loaded data and model before failing. dapo_exp.preflight,
called by run.py's precheck with the distinct jobs' configs: vLLM for ``rollout=vllm``, verl's
environment for ``backend=verl`` (and its vLLM in CPU mode), a hub model that is reachable or cached, a math
task's data (a mistyped path, a data set on a hub that cannot be reached: issue 49 saw 20 jobs each end in a
traceback).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dapo_exp import preflight
from dapo_exp.config import ConfigError
from dapo_exp.hydra_setup import compose_config

ROOT = Path(__file__).resolve().parents[1]


def _needs(*overrides: str) -> list[tuple[str, str]]:
    return [(n.what, n.key) for n in preflight.needs(compose_config(list(overrides)))]


def test_each_job_says_what_it_needs():
    assert _needs() == []  # the toy: nothing (its model is built or shipped here)
    assert _needs("rollout=vllm") == [("vllm", "")]
    assert _needs("model.path=Qwen/Qwen2.5-0.5B") == [("model", "Qwen/Qwen2.5-0.5B")]
    assert _needs("backend=verl", "train.device=cpu") == [("verl", ".venv-verl/bin/python"),
                                                         ("verl-vllm", ".venv-verl/bin/python")]
    assert _needs("backend=verl", "backend.dry_run=true") == []  # a dry run launches nothing
    assert _needs("backend=verl") == [("verl", ".venv-verl/bin/python"), ("gpu", "")]  # train.device=auto, local
    slurm = _needs("backend=verl", "backend.launch=slurm", "model.path=Qwen/Qwen2.5-0.5B")
    assert slurm == [("verl", ".venv-verl/bin/python")]  # the model is loaded on the cluster's nodes
    assert [what for what, _ in _needs("task=gsm8k")] == ["task-data"]  # read from a file or the hub
    assert _needs("task=gsm8k", "fixes=grpo") == _needs("task=gsm8k", "fixes=full")  # one need for every job


def test_a_math_tasks_hub_data_is_asked_for_once_however_many_jobs(monkeypatch):
    from huggingface_hub import HfApi

    calls = []

    def unreachable(self, repo_id, **kwargs):
        calls.append(repo_id)
        raise ConnectionError("connection refused")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(HfApi, "dataset_info", unreachable)
    cfgs = [compose_config(["task=dapo_math", f"fixes={p}"]) for p in ("grpo", "clip", "clip_ds", "full")]
    with pytest.raises(ConfigError, match=r"^task\.train_source: cannot reach the Hugging Face hub at .* to load "):
        preflight.check(cfgs)
    assert calls == ["BytedTsinghua-SIA/DAPO-Math-17k"]  # once, for the first source, then refused


def test_a_need_shared_by_many_jobs_is_checked_once(monkeypatch):
    calls = []
    monkeypatch.setitem(preflight.CHECKS, "vllm", lambda need: calls.append(need.key))
    cfgs = [compose_config(["rollout=vllm", f"fixes={p}"]) for p in ("grpo", "clip", "clip_ds", "full")]
    preflight.check(cfgs)
    assert calls == [""]


def test_vllm_missing_is_one_line_naming_the_install(monkeypatch):
    monkeypatch.setattr(preflight.importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(ConfigError, match=r'^rollout=vllm: vLLM is not installed .*pip install -e "\.\[vllm\]"'):
        preflight.check([compose_config(["rollout=vllm"])])


def test_verls_environment_missing_names_its_install(tmp_path):
    with pytest.raises(ConfigError, match=r"backend\.python=.*bash \.ci/install-verl"):
        preflight.check([compose_config(["backend=verl", f"backend.python={tmp_path / 'none' / 'python'}"])])


def _sweep(tmp_path: Path, *overrides: str, env: dict | None = None, prelude: str = "") -> subprocess.CompletedProcess:
    """``run.py -m <overrides>`` into ``tmp_path/sweep`` (``prelude``: Python run before run.py, in its process)."""
    argv = ["run.py", "-m", "logger=none", "seed=0,1", f"hydra.sweep.dir={tmp_path / 'sweep'}", *overrides]
    code = f"{prelude}\nimport runpy, sys\nsys.argv = {argv!r}\nrunpy.run_path('run.py', run_name='__main__')"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def _refused_once(out: subprocess.CompletedProcess, tmp_path: Path, *needles: str) -> None:
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), out.stderr[-2000:]
    assert all(n in lines[0] for n in needles), lines[0]
    assert not (tmp_path / "sweep").exists() or not any((tmp_path / "sweep").rglob("summary.json"))


def test_a_sweep_whose_model_the_hub_cannot_give_is_refused_once(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    out = _sweep(tmp_path, "fixes=grpo,full", "model.path=Qwen/Qwen2.5-0.5B", env=env)
    _refused_once(out, tmp_path, "model.path='Qwen/Qwen2.5-0.5B'", "model.path=/path/to/model_dir")


def test_a_sweep_whose_data_path_is_mistyped_is_refused_once(tmp_path):
    data = tmp_path / "gsm8k_train.parquet"  # never written: the path is mistyped
    out = _sweep(tmp_path, "fixes=grpo,full", "task=gsm8k", f"task.train_source={data}")
    _refused_once(out, tmp_path, "task.train_source", str(data))


@pytest.mark.parametrize("content, says", [
    ('{"foo": 1}\n{"foo": 2}\n', "cannot tell the schema from its columns ['foo']"),
    ('{"question": "1+1?", "answer": ""}\n', "none of its first 1 rows is a usable problem of the gsm8k schema"),
    ("", "holds no rows"),
])
def test_a_sweep_whose_data_file_cannot_be_used_is_refused_once(tmp_path, content, says):
    """A data file that exists but that no job could train on (columns of no known schema, no usable row, empty) is
    read once by the launch check and refused in one line naming the field and the file, before any job (before:
    each job of the sweep failed with its own traceback)."""
    data = tmp_path / "train.jsonl"
    data.write_text(content)
    out = _sweep(tmp_path, "fixes=grpo,full", "task=gsm8k", f"task.train_source={data}")
    _refused_once(out, tmp_path, f"task.train_source={data}: {says}")


def test_a_data_file_that_cannot_be_read_is_named_and_a_good_one_passes(tmp_path):
    from dapo_exp.tasks.math_data import Source, TaskSourceError, check_file_rows

    broken = tmp_path / "train.parquet"
    broken.write_text("not a parquet file\n")
    with pytest.raises(TaskSourceError, match=rf"^task\.train_source={broken}: cannot be read: "):
        check_file_rows(Source("train", "file", str(broken)), "task.train_source")
    good = tmp_path / "good.jsonl"
    good.write_text('{"foo": 1}\n{"question": "1+1?", "answer": "#### 2"}\n')
    check_file_rows(Source("good", "file", str(good)), "task.train_source")  # a known schema, one usable problem


def test_a_sweep_whose_data_set_the_hub_cannot_give_is_refused_once(tmp_path):
    import socket

    with socket.socket() as s:  # a port on 127.0.0.1 that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = _sweep(tmp_path, "fixes=grpo,full", "task=gsm8k",
                 env={"HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0"})
    _refused_once(out, tmp_path, "task.train_source: cannot reach the Hugging Face hub", "task.train_source=/path/to/")


def test_a_sweep_without_vllm_is_refused_once(tmp_path):
    hide = ("import importlib.util as u\n_find = u.find_spec\n"
            "u.find_spec = lambda name, *a, **k: None if name == 'vllm' else _find(name, *a, **k)")
    out = _sweep(tmp_path, "fixes=grpo,full", "rollout=vllm", prelude=hide)
    _refused_once(out, tmp_path, "rollout=vllm: vLLM is not installed", 'pip install -e ".[vllm]"')


def test_a_verl_sweep_without_verls_environment_is_refused_once(tmp_path):
    out = _sweep(tmp_path, "fixes=grpo,full", "backend=verl", "train.device=cpu",
                 f"backend.python={tmp_path / 'no-venv' / 'bin' / 'python'}")
    _refused_once(out, tmp_path, "backend.python=", "bash .ci/install-verl")


def test_a_verl_gpu_sweep_on_a_machine_without_a_gpu_is_refused_once(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: verl's local GPU launch is not refused here")
    out = _sweep(tmp_path, "fixes=grpo,full", "backend=verl", f"backend.python={sys.executable}")
    _refused_once(out, tmp_path, "train.device=auto: this machine has no GPU", "train.device=cpu")


def test_a_second_different_sweep_into_a_sweep_directory_is_refused_naming_the_first(tmp_path, warm_cache):
    """Issue 48: a second sweep into the same hydra.sweep.dir overwrote the first one's multirun.yaml. A sweep
    directory holds one sweep: another set of configurations is refused before any job, in one line naming the
    first sweep's command; the same command again, more seeds of the same configurations (given in another order,
    with another launcher or logger) are accepted."""
    from helpers import CONF, NO_FIGURES, SMALL

    sweep = tmp_path / "sweep"
    common = [*SMALL, "train.steps=1", f"model.cache_dir={warm_cache}", f"hydra.sweep.dir={sweep}"]
    # its end analysis without figures (~12 of this test's ~30 CPU-s): a Hydra override, not in the record's jobs
    first = subprocess.run([sys.executable, "run.py", "-m", *common, "fixes=grpo,clip", "seed=0",
                            NO_FIGURES], cwd=ROOT,
                           capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert first.returncode == 0, first.stderr[-3000:]
    record = (sweep / "multirun.yaml").read_bytes()
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir() and p.name != "analysis")

    out = subprocess.run([sys.executable, "run.py", "-m", *common, "fixes=grpo,full", "seed=0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {sweep} holds another sweep"), \
        out.stderr[-3000:]
    assert "fixes=grpo,clip seed=0" in lines[0] and "fixes=full" in lines[0] and "sweep=" in lines[0], lines[0]
    assert (sweep / "multirun.yaml").read_bytes() == record
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir() and p.name != "analysis") == jobs

    for again in (["fixes=grpo,clip", "seed=0"], ["fixes=clip,grpo", "seed=0,1,2"], ["seed=range(0,4)", "fixes=grpo,clip",
                  "hydra/launcher=parallel", "logger=wandb", "logger.mode=offline"]):
        preflight.precheck(["-m", *common, *again], CONF, machine=False)  # accepted: nothing raised
    with pytest.raises(ConfigError, match="holds another sweep"):
        preflight.precheck(["-m", *common, "fixes=grpo", "seed=0"], CONF, machine=False)  # a subset is another sweep
    # one command per configuration of one study, each leaving the analysis for after the last (fractional.sh)
    preflight.precheck(["-m", *common, "fixes=grpo", "clip_higher=enabled", "seed=0", "~hydra.callbacks.analysis"],
                       CONF, machine=False)
