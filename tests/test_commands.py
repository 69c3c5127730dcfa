"""Every command a newcomer is told to run, tested as text: those of the README and the docs, and the
advice the command lines print (``plan``'s command that adds seeds, the analysis' one-seed line, a
study's commands, a refusal's fix, ``run.py --help``, the commands written in the package's messages).

Each command is split as a POSIX shell splits it (:mod:`shlex`: quotes removed, ``&&`` / ``;`` / ``|``
separate commands, ``# comments`` dropped, backslash continuations joined, ``$ `` prompts dropped,
variables assigned earlier in the same block expanded). A ``python run.py`` command's overrides are
parsed one by one with Hydra's own parser, then the command is checked as ``run.py`` checks it before
launch (:func:`dapo_exp.preflight.precheck`: every distinct job composed, its keys and values
checked, a sweep's GPU-hour threshold); ``--help`` runs for real. A ``python -m dapo_exp...`` command
names a module that exists and only options its ``--help`` lists (docs/reference/cli-help.md); the
analysis' ``design`` and ``plan`` on committed files run for real, in-process. A failure names the
file and line (or the advice), the command, and the override or option at fault.

Placeholders are left out of the checks, not guessed: ``<dir>``-style words, ``...``, and variables
no earlier line of the block assigns. :data:`KNOWN_BROKEN` lists the commands, in pages another piece
of work owns, that fail today; each entry must keep failing (a strict expectation), so a fix there
fails here until its entry goes.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import json
import os
import re
import shlex
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL_FENCES = {"bash", "sh", "shell", "console"}
PYTHONS = re.compile(r"^(?:\S*/)?python3?$")  # python, python3, bin/python, .venv/bin/python, ...
RUN_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                        "--config-dir", "-cd", "--experimental-rerun", "--info", "-i"}
HELP_PAGE = ROOT / "docs" / "reference" / "cli-help.md"

# Documented commands known to fail today, with why (none now). Each must still fail: when its page is
# fixed, remove its entry.
KNOWN_BROKEN: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Command:
    where: str  # "docs/how-to/gpu.md:50", or the advice it came from
    text: str  # as written (comments and prompts dropped, continuations joined)
    words: tuple[str, ...]  # as the shell passes them, variables of the block expanded
    env: tuple[str, ...] = ()  # the assignments before it on its line (DAPO_EXP_FIXES=adv_clip.py)


# --------------------------------------------------------------------------- #
# Splitting as a shell does                                                    #
# --------------------------------------------------------------------------- #
HOLE = "\u2039x\u203a"  # what a `<name>` placeholder becomes before splitting (not a redirection)


def shell_split(line: str) -> list[str]:
    """``line``'s words as a POSIX shell splits them: quotes removed, a ``#`` word and the rest dropped,
    ``&&``, ``||``, ``;``, ``|``, ``>`` their own words; a ``<name>`` placeholder kept as one word
    (:data:`HOLE`). Raises ValueError on an unbalanced quote."""
    line = re.sub(r"<[^<>\n]+>", HOLE, line)
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def simple_commands(words: list[str]) -> list[list[str]]:
    """The simple commands of a list of words: split at ``&&``, ``||``, ``;``, ``|``, ``&``, without
    their redirections (``> log``)."""
    out: list[list[str]] = [[]]
    skip = False
    for w in words:
        if skip:
            skip = False
        elif w in ("&&", "||", ";", "|", "&"):
            out.append([])
        elif w in (">", ">>", "<", "2>", "&>"):
            skip = True  # the file it names is no argument
        else:
            out[-1].append(w)
    return [c for c in out if c]


ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def expand(words: list[str], variables: dict[str, str]) -> list[str]:
    """``$NAME`` / ``${NAME}`` of ``variables`` substituted; a word that is only one is split into words."""
    out: list[str] = []
    for w in words:
        whole = re.fullmatch(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?", w)
        if whole and whole.group(1) in variables:
            out += shlex.split(variables[whole.group(1)])
            continue
        out.append(re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?",
                          lambda m: variables.get(m.group(1), m.group(0)), w))
    return out


def python_commands(line: str, where: str, variables: dict[str, str]) -> list[Command]:
    """The ``python run.py`` and ``python -m dapo_exp...`` commands of one shell line; assignments on a
    line of their own (``ARGS="..."``) go into ``variables`` for the lines after."""
    text = re.sub(r"(^|\s)#.*$", "", line).strip()
    words = shell_split(line)
    out = []
    for cmd in simple_commands(words):
        env = 0
        while env < len(cmd) and ASSIGNMENT.match(cmd[env]):
            env += 1
        if env == len(cmd):  # only assignments: variables for the commands after
            variables.update(dict(a.split("=", 1) for a in cmd))
            continue
        argv = expand(cmd[env:], variables)
        if len(argv) >= 2 and PYTHONS.match(argv[0]) and (
                argv[1] == "run.py" or (argv[1] == "-m" and len(argv) > 2 and argv[2].startswith("dapo_exp"))):
            out.append(Command(where, text, tuple(argv[1:]), tuple(expand(cmd[:env], variables))))
    return out


# --------------------------------------------------------------------------- #
# The commands of the README and the docs                                      #
# --------------------------------------------------------------------------- #
INLINE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
SYNOPSIS = re.compile(r"\[-|\\\||\{|\}")  # `cmd [--opt X]`, `a\|b` in a table, `{a,b}`: a usage line, not a command


def shell_snippets(path: Path, root: Path = ROOT) -> list[tuple[str, str, int | None]]:
    """``(where, text, block)`` for every line of ``path``'s ```bash / sh / shell / console blocks
    (continuations joined, ``$ `` prompts dropped; ``block`` numbers the block, for its variables) and every
    inline code span of its prose (``block`` None; headings left out: they name a command, they do not run
    one); ``where`` is the path relative to ``root`` and the line."""
    rel = path.relative_to(root).as_posix()
    out: list[tuple[str, str, int | None]] = []
    fence: str | None = None
    blocks = 0
    pending, start = "", 0
    for i, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            if fence is None:
                fence, blocks = stripped[3:].strip().lower(), blocks + 1
            else:
                fence = None
            continue
        if fence is not None:
            if fence not in SHELL_FENCES:
                continue
            if not pending:
                start = i
                line = re.sub(r"^\s*\$ ", "", line)
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            out.append((f"{rel}:{start}", pending + line, blocks))
            pending = ""
            continue
        if not stripped.startswith("#"):
            out += [(f"{rel}:{i}", span.strip(), None) for span in INLINE.findall(line)]
    return out


def markdown_commands(path: Path, root: Path = ROOT) -> list[Command]:
    """The python commands of ``path`` (:func:`shell_snippets`): every line of its shell blocks, the
    variables a block assigns expanded in its later lines, and every inline code span that starts with a
    python command."""
    out: list[Command] = []
    variables: dict[str, str] = {}
    current = None
    for where, text, block in shell_snippets(path, root):
        if block is None:
            if re.match(r"^(?:[A-Z_]+=\S+ )*(?:\S*/)?python3? (?:run\.py|-m dapo_exp)", text) and not SYNOPSIS.search(text):
                out += python_commands(text, where, {})
            continue
        if block != current:
            variables, current = {}, block
        out += python_commands(text, where, variables)
    return out


def doc_commands() -> list[Command]:
    return [c for path in DOC_FILES for c in markdown_commands(path)]


# --------------------------------------------------------------------------- #
# The checks                                                                   #
# --------------------------------------------------------------------------- #
def outside_fix_command(cmd: Command) -> bool:
    """A command that names a fix module of the user's (``DAPO_EXP_FIXES=...``): its overrides name that fix's
    keys, so it is checked with the documented file by ``tests/test_extension_outside.py``."""
    from dapo_exp.fixes.base import MODULES_ENV

    return any(a.startswith(f"{MODULES_ENV}=") for a in cmd.env)


def placeholder(word: str) -> bool:
    """A word that stands for something the reader supplies: ``<dir>``, ``...``, ``[overrides]``, an
    unassigned ``$VAR``."""
    return bool(re.search(rf"{HOLE}|<[^>]*>|\.\.\.|\$\{{?[A-Za-z_]|^\[[a-z ]+\]$", word))


def check_run_py(cmd: Command) -> str | None:
    """Why ``python run.py <args>`` would fail when pasted, or None. Its overrides parsed one by one with
    Hydra's parser (naming the one at fault), then the launch check, ``--cfg`` and ``--help`` set aside."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    from dapo_exp.cli_errors import describe
    from dapo_exp.hydra_setup import CONFIG_DIR
    from dapo_exp.preflight import precheck

    args = list(cmd.words[1:])
    if any(a in ("--help", "-h", "--hydra-help") for a in args):
        return check_help(tuple(a for a in args if not placeholder(a)))
    dry = any(a in ("--cfg", "-c") or a.startswith("--cfg=") for a in args)  # prints, launches nothing
    rest, i = [], 0
    while i < len(args):
        a = args[i]
        if a in RUN_FLAGS_WITH_VALUE:
            i += 2
            continue
        if a.startswith("-") and a not in ("-m", "--multirun"):
            i += 1
            continue
        rest.append(a)
        i += 1
    overrides = [a for a in rest if a not in ("-m", "--multirun")]
    parser = OverridesParser.create()
    for o in overrides:
        if placeholder(o):
            continue
        try:
            parser.parse_overrides([o])
        except OverrideParseException as exc:
            return f"the override {o!r} does not parse: {describe(exc, CONF)}"
    kept = [a for a in rest if not placeholder(a)]
    try:
        precheck(kept, CONFIG_DIR, launch=not dry, machine=False)  # the text, not this machine's installs
    except Exception as exc:  # noqa: BLE001 - the message names what failed
        return f"refused before launch: {describe(exc, CONF) or f'{type(exc).__name__}: {exc}'}"
    return None


_HELP: dict[tuple[str, ...], str | None] = {}


def check_help(args: tuple[str, ...]) -> str | None:
    """``python run.py <args> --help`` run for real (once per argument list)."""
    if args not in _HELP:
        out = subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, capture_output=True, text=True,
                             timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
        _HELP[args] = None if out.returncode == 0 else f"exit {out.returncode}: {out.stderr.strip()[-500:]}"
    return _HELP[args]


def help_sections() -> dict[str, str]:
    """``{"python -m dapo_exp.analysis plan": its --help text}`` from the generated help page."""
    text = HELP_PAGE.read_text()
    return {m.group(1): m.group(2) for m in re.finditer(r"^## `([^`]+)`\n\n```text\n(.*?)```", text, flags=re.M | re.S)}


def check_module(cmd: Command) -> str | None:
    """Why ``python -m dapo_exp.<module> <args>`` would fail, or None: the module exists, its options
    are ones its ``--help`` lists, and the analysis' ``design`` (and ``plan`` on a committed file) run."""
    module, args = cmd.words[1], list(cmd.words[2:])
    if importlib.util.find_spec(module) is None:
        return f"no module {module}"
    sections = help_sections()
    sub = args[0] if args and f"python -m {module} {args[0]}" in sections else None
    usage = sections.get(f"python -m {module} {sub}" if sub else f"python -m {module}")
    if usage is not None:
        for a in args:
            option = a.split("=", 1)[0]
            if option.startswith("--") and not placeholder(option) and not re.search(rf"{re.escape(option)}\b", usage):
                return f"the option {option} is not in `python -m {module}{' ' + sub if sub else ''} --help`"
    if module == "dapo_exp.analysis" and sub in ("design", "plan") and len(args) > 1 \
            and not any(placeholder(a) for a in args):
        if sub == "plan" and not (ROOT / args[1]).exists():
            return None  # a sweep of the reader's: not here
        return run_analysis(args)[1]
    return None


def run_analysis(args: list[str]) -> tuple[str, str | None]:
    """``python -m dapo_exp.analysis <args>`` in-process, from the repository root: (stdout, why it failed)."""
    from dapo_exp.analysis.cli import main

    out, here = io.StringIO(), os.getcwd()
    try:
        os.chdir(ROOT)
        with contextlib.redirect_stdout(out):
            code = main(list(args))
    except SystemExit as exc:
        code = exc.code
    finally:
        os.chdir(here)
    return out.getvalue(), None if code in (0, None) else f"exit {code}"


def check(cmd: Command) -> str | None:
    """Why ``cmd`` would fail when pasted, or None."""
    return check_run_py(cmd) if cmd.words[0] == "run.py" else check_module(cmd)


def failure(cmd: Command, why: str) -> str:
    return f"{cmd.where}: `{cmd.text}` fails: {why}"


def commands_in(text: str, where: str) -> list[Command]:
    """The python commands of printed advice: in every line, and every `code span`, from ``python`` to the
    end of the span or of the command (a parenthesis, a ``;``, a ``: `` or two spaces, after which
    prose or another column goes on)."""
    out = []
    for line in text.splitlines():
        spans = INLINE.findall(line) or [line]
        starts = r"(?<!\S)(?=((?:\S*/)?python3? (?:run\.py|-m dapo_exp)[^`()\n;]*))"  # each, overlapping
        for m in (m for span in spans for m in re.finditer(starts, span)):
            command = re.split(r": |\s{2,}", m.group(1), maxsplit=1)[0].rstrip(" .;:,")
            if SYNOPSIS.search(command):
                continue
            try:
                out += python_commands(command, where, {})
            except ValueError as exc:  # an unbalanced quote
                raise AssertionError(f"{where}: `{command}` does not split as a shell command: {exc}") from None
    return out


# --------------------------------------------------------------------------- #
# The checker itself                                                           #
# --------------------------------------------------------------------------- #
OLD_FORM = """More seeds in the same sweep:
`python run.py -m fixes=grpo,clip,clip_ds,full "seed=range(0,10)" sweep='fixes=grpo,clip,clip_ds,full'`
"""


def test_the_checker_fails_on_the_single_quoted_sweep_name_a_shell_unquotes(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(OLD_FORM)
    (cmd,) = markdown_commands(page, tmp_path)
    assert cmd.words[-1] == "sweep=fixes=grpo,clip,clip_ds,full"  # the shell took the quotes away
    why = check(cmd)
    assert why is not None and "sweep=fixes=grpo,clip,clip_ds,full" in why and "does not parse" in why, why
    assert "\"sweep='fixes=grpo,clip,clip_ds,full'\"" in why  # the message says how to quote it
    assert failure(cmd, why).startswith("page.md:2: `python run.py -m fixes=grpo,clip,clip_ds,full")
    fixed = Command("page.md:2", cmd.text, (*cmd.words[:-1], "sweep='fixes=grpo,clip,clip_ds,full'"))
    assert check(fixed) is None


def test_the_checker_names_a_misspelt_key_an_unknown_option_and_an_unknown_flag():
    bad_key = Command("x.md:1", "python run.py algo.clip_hgih=0.3", ("run.py", "algo.clip_hgih=0.3"))
    assert "did you mean algo.eps_high?" in check(bad_key)
    bad_option = Command("x.md:1", "", ("run.py", "-m", "fixes=grpo,ful"))
    assert "fixes=ful: no such option" in check(bad_option)
    bad_flag = Command("x.md:1", "", ("-m", "dapo_exp.analysis", "plan", "x.csv", "--detla", "5"))
    assert "--detla" in check(bad_flag)
    assert check(Command("x.md:1", "", ("-m", "dapo_exp.no_such_module"))) == "no module dapo_exp.no_such_module"


def test_shell_splitting_joins_continuations_expands_the_blocks_variables_and_drops_placeholders(tmp_path):
    page = tmp_path / "p.md"
    page.write_text('```bash\nARGS="fixes=grpo,full seed=0"\n$ bin/python run.py -m $ARGS \\\n'
                    "    logger=none   # a comment\nbash .ci/install && python run.py --help\n```\n"
                    "Inline: `python -m dapo_exp.analysis design fractional` and `run.py x`.\n")
    cmds = markdown_commands(page, tmp_path)
    assert [(c.where, c.words) for c in cmds] == [
        ("p.md:3", ("run.py", "-m", "fixes=grpo,full", "seed=0", "logger=none")),
        ("p.md:5", ("run.py", "--help")),
        ("p.md:7", ("-m", "dapo_exp.analysis", "design", "fractional"))]
    assert placeholder("model.path=<dir>") and placeholder("...") and placeholder("$SEEDS")
    assert not placeholder("seed=range(0,5)")


# --------------------------------------------------------------------------- #
# The README and the docs                                                       #
# --------------------------------------------------------------------------- #
@pytest.mark.slow
def test_every_documented_command_parses_and_passes_the_launch_check(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # the launch check counts finished runs under ./multirun: none here
    commands = doc_commands()
    assert len(commands) > 80, len(commands)
    where = {c.where.split(":")[0] for c in commands}
    assert {"README.md", "docs/tutorial.md", "docs/how-to/gpu.md", "docs/how-to/seeds-and-studies.md"} <= where
    failures, seen = [], {}
    for cmd in commands:
        if outside_fix_command(cmd):  # needs the user's file: tests/test_extension_outside.py runs these with it
            continue
        if cmd.words not in seen:
            seen[cmd.words] = check(cmd)
        why = seen[cmd.words]
        key = (cmd.where.split(":")[0], cmd.text)
        if key in KNOWN_BROKEN:
            assert why is not None, f"{cmd.where}: `{cmd.text}` passes now: remove its KNOWN_BROKEN entry"
            continue
        if why is not None:
            failures.append(failure(cmd, why))
    assert not failures, "\n".join(failures)


def test_the_gpu_how_tos_cost_figures_are_what_the_launch_line_says():
    """Each sweep of docs/how-to/gpu.md with a `(~N GPU-h` comment: N is the launch line's estimate, and
    `N runs` its run count; the launch line shown there is the one the sweep prints."""
    from test_sweeps import _multirun_config

    from dapo_exp.analysis.callback import launch_plan

    page = ROOT / "docs" / "how-to" / "gpu.md"
    text = page.read_text()
    checked = 0
    for lineno, line in enumerate(text.splitlines(), 1):
        m = re.search(r"#.*?(?:(\d+) runs?.*?)?\(~([\d,.]+) GPU-h", line)
        if not m or not line.startswith("python run.py -m"):
            continue
        (cmd,) = python_commands(line, f"gpu.md:{lineno}", {})
        overrides = [w for w in cmd.words[1:] if w != "-m"]
        swept = [o for o in overrides if "," in o.split("=", 1)[1]]
        plan = launch_plan(_multirun_config([o for o in overrides if o not in swept], overrides))
        hours = re.search(r"estimated cost ~([\d,.]+) GPU-hours", plan)
        assert hours and hours.group(1) == m.group(2), (lineno, line, plan)
        if m.group(1):
            assert plan.startswith(f"[sweep] {m.group(1)} runs"), (lineno, line, plan)
        checked += 1
    assert checked >= 4, checked
    shown = re.search(r"^\[sweep\] .*$", text, flags=re.M).group(0)
    plan = launch_plan(_multirun_config(["experiment=qwen0.5b_gsm8k"],
                                        ["experiment=qwen0.5b_gsm8k", "fixes=grpo,clip,clip_ds,full"]))
    assert shown == plan


# --------------------------------------------------------------------------- #
# Pasted into a fresh shell: the docs' other commands, the sweep folders        #
# --------------------------------------------------------------------------- #
ACTIVATES = re.compile(r"^(?:source|\.) \S*/bin/activate$|^(?:conda|mamba) activate \S+$")
NEEDS_THE_ENVIRONMENT = {"pip", "pip3", "mkdocs", "jupyter"}  # console scripts of the project's environment


def snippet_commands(path: Path, root: Path = ROOT):
    """``(where, text, block, command)`` of each simple command of ``path``'s shell snippets
    (:func:`shell_snippets`); a code span that does not parse as shell is prose, skipped."""
    for where, text, block in shell_snippets(path, root):
        try:
            commands = simple_commands(shell_split(text))
        except ValueError:  # prose in a code span, not a command
            continue
        for cmd in commands:
            yield where, text, block, cmd


def pasted_failures(path: Path, root: Path = ROOT) -> list[str]:
    """Why commands of ``path`` fail when pasted into a fresh shell on the documented setup (a root container,
    the project's environment made by ``bash .ci/install`` and not active): ``sudo`` (a root container has
    none: the page says "as root"), and ``pip``, ``mkdocs`` or ``jupyter`` before any block of the page
    activates an environment (the system's pip refuses to install, PEP 668; the others are not on the path):
    ``bin/python -m pip ...`` runs them in the project's environment."""
    failures, active = [], False
    for where, text, block, cmd in snippet_commands(path, root):
        argv = cmd[next((i for i, w in enumerate(cmd) if not ASSIGNMENT.match(w)), len(cmd)):]
        if block is not None and ACTIVATES.match(" ".join(argv)):
            active = True
        if len(argv) < 2 or (block is None and argv[0] not in {"sudo", *NEEDS_THE_ENVIRONMENT}):
            continue
        if argv[0] == "sudo":
            failures.append(f"{where}: `{text.strip()}`: no sudo in a root container (say: as root)")
        elif argv[0] in NEEDS_THE_ENVIRONMENT and not active:
            failures.append(f"{where}: `{text.strip()}`: {argv[0]} outside the project's environment "
                            f"(bin/python -m {argv[0]} ..., or activate .venv first)")
    return failures


def test_the_paste_check_names_sudo_and_an_install_outside_the_environment(tmp_path):
    page = tmp_path / "p.md"
    page.write_text('Build it: `pip install -e ".[docs]" && mkdocs serve`, or `bin/python -m pip install -e ".[docs]"`.\n'
                    "```bash\nsudo bash .ci/slurm up   # start it\nbash .ci/slurm up        # as root\n```\n"
                    "```bash\nsource .venv/bin/activate\npip install -e \".[slurm]\"\n```\n"
                    "Then `pip install -e \".[vllm]\"` in that shell; `pip`'s report.\n")
    assert pasted_failures(page, tmp_path) == [
        'p.md:1: `pip install -e ".[docs]" && mkdocs serve`: pip outside the project\'s environment '
        "(bin/python -m pip ..., or activate .venv first)",
        'p.md:1: `pip install -e ".[docs]" && mkdocs serve`: mkdocs outside the project\'s environment '
        "(bin/python -m mkdocs ..., or activate .venv first)",
        "p.md:3: `sudo bash .ci/slurm up   # start it`: no sudo in a root container (say: as root)"]


# Documented commands of pages another piece of work owns that fail when pasted (a strict expectation, as
# KNOWN_BROKEN): (page, the command as written) -> why.
KNOWN_UNPASTEABLE: dict[tuple[str, str], str] = {}


def test_every_documented_command_runs_when_pasted_into_a_fresh_shell():
    failures = [f for path in DOC_FILES for f in pasted_failures(path)]
    known = [f for f in failures if any(f.startswith(f"{page}:") and f"`{text}`" in f for page, text in KNOWN_UNPASTEABLE)]
    assert len(known) == len(KNOWN_UNPASTEABLE), f"a KNOWN_UNPASTEABLE entry passes now: remove it ({known})"
    assert not set(failures) - set(known), "\n".join(sorted(set(failures) - set(known)))


SCRIPTS = sorted((ROOT / "sweeps").glob("*.sh"))
# the project's interpreter, as .ci/venv chooses it (the active environment, else .venv), unless PYTHON names one
PROJECT_PYTHON = 'PY="${PYTHON:-$(bash .ci/venv --find)}"'
# not a path's, a string's, ${cmd#python }, "$PY" -m pip's
BARE_PYTHON = re.compile(r"(?<![\w/.$\"'#-])(?<!-m )(?:python3?|pip3?) ")
FAKE_PROJECT_PYTHON = """#!{python}
import json, os, subprocess, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(args) + "\\n")
# what the script reads back (.ci/venv's check, the fractional design, the studies) comes from the real one
if args[:1] == ["-c"] or args[:3] == ["-m", "dapo_exp.analysis", "design"]:
    sys.exit(subprocess.run([{python!r}, *args], env={{**os.environ, "OMP_NUM_THREADS": "1"}}).returncode)
"""


def script_calls(script: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """``bash sweeps/<script>`` in a fresh shell: no python on the path, the project's environment
    ($VIRTUAL_ENV, as .ci/venv finds it) a fake that records each call and runs none of the training; the
    calls' arguments."""
    env_dir, tools = tmp_path / "env", tmp_path / "tools"
    (env_dir / "bin").mkdir(parents=True)
    tools.mkdir()
    fake = env_dir / "bin" / "python"
    fake.write_text(FAKE_PROJECT_PYTHON.format(python=sys.executable))
    fake.chmod(0o755)
    for tool in ("bash", "dirname"):  # the only programs the scripts and .ci/venv call
        (tools / tool).symlink_to(subprocess.run(["bash", "-c", f"command -v {tool}"], capture_output=True,
                                                 text=True, check=True).stdout.strip())
    log = tmp_path / "calls.jsonl"
    log.write_text("")
    env = {"PATH": str(tools), "HOME": str(tmp_path), "VIRTUAL_ENV": str(env_dir), "FAKE_LOG": str(log),
           "PYTHONPATH": str(ROOT)}
    out = subprocess.run([str(tools / "bash"), str(script)], env=env, capture_output=True, text=True, timeout=300)
    return out, [json.loads(line) for line in log.read_text().splitlines()]


CHECK_SCRIPTS = sorted((ROOT / "sweeps" / "checks").glob("*.sh"))
# The checks that compare two checkouts run the interpreter of the checkout under test (their REPO argument's .venv,
# or their PYTHON argument), not this project's: set once, by that line.
OTHER_CHECKOUT_PYTHON = {"refactor_check.sh": 'PY="${3:-$REPO/.venv/bin/python}"',
                         "slot_check.sh": 'PY="${3:-$REPO/.venv/bin/python}"'}


def test_every_sweep_script_runs_the_projects_interpreter():
    """No line of a script under sweeps/ or sweeps/checks/ runs a bare python or pip (a fresh shell has none: exit
    127); each runs "$PY", set once from .ci/venv (the active environment, else .venv) unless PYTHON names one (the
    checks of another checkout: that checkout's, :data:`OTHER_CHECKOUT_PYTHON`)."""
    assert SCRIPTS and CHECK_SCRIPTS
    assert set(OTHER_CHECKOUT_PYTHON) <= {s.name for s in CHECK_SCRIPTS}, OTHER_CHECKOUT_PYTHON
    for script in [*SCRIPTS, *CHECK_SCRIPTS]:
        where = script.relative_to(ROOT).as_posix()
        code = [re.sub(r"\s#\s.*$", "", line).rstrip() for line in script.read_text().splitlines()
                if not line.lstrip().startswith("#")]
        bare = [line.strip() for line in code if BARE_PYTHON.search(line)]
        assert not bare, f"{where}: a bare interpreter: {bare}"
        unquoted = [line.strip() for line in code if re.search(r'(?<!")\$PY\b(?!")', line)]
        assert not unquoted, f"{where}: an unquoted $PY (a path with a space splits): {unquoted}"
        setting = OTHER_CHECKOUT_PYTHON.get(script.name, PROJECT_PYTHON) if script in CHECK_SCRIPTS else PROJECT_PYTHON
        text = "\n".join(code)
        assert '"$PY" ' in text and text.count(setting) == 1 and len(re.findall(r"(?<!\w)PY=", text)) == 1, \
            f"{where}: {setting} (once) and \"$PY\" calls"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_sweep_script_pasted_into_a_fresh_shell_runs_each_step_with_the_projects_interpreter(script, tmp_path):
    out, calls = script_calls(script, tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    runs = [c for c in calls if c[:1] == ["run.py"]]
    assert runs and all(c[1] == "-m" for c in runs), calls  # each sweep went to the project's interpreter
    # what the folder test below reads from the script is what its shell runs
    read = [list(c.words) for c in script_runs(script)]
    assert all(any(_same_call(r, c) for r in read) for c in runs) and all(any(_same_call(r, c) for c in runs)
                                                                          for r in read), (read, runs)


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_sweep_scripts_commands_pass_the_launch_check(script, tmp_path, monkeypatch):
    """Each ``run.py`` call a script makes, as its shell expands it (the fake interpreter's record), passes
    the check ``run.py`` makes before launch."""
    _, calls = script_calls(script, tmp_path)
    monkeypatch.chdir(tmp_path)  # the launch check counts finished runs under ./multirun: none here
    _checked([Command(f"sweeps/{script.name}", shlex.join(c), tuple(c)) for c in calls if c[:1] == ["run.py"]])


# What does not change which runs a command makes, or what they compute: where and how its jobs run.
NOT_THE_STUDY = ("seed=", "sweep=", "hydra.sweep.dir=", "local=", "logger=", "hydra/launcher=", "hydra.launcher.",
                 "backend.dry_run=")
SWEEP_SCRIPT = re.compile(r"^sweeps/([\w-]+\.sh)$")  # a recipe (sweeps/checks/*.sh write no sweep folder)
SCRIPT_SETTING = re.compile(r'^([A-Z_]+)="\$\{\1:-([^}]*)\}"')  # SEEDS="${SEEDS:-0,1,2}": the caller's, else this
SCRIPT_ARRAY = re.compile(r"^([A-Z_]+)=\((.*)\)$")  # STUDY=(experiment=toy_overlong fixes=grpo ...)
NOTEBOOK = ROOT / "sweeps" / "README.md"  # the recipes and the lab notebook: their commands are examples too


def script_runs(script: Path, args: tuple[str, ...] | list[str] = (), env: dict[str, str] | None = None,
                where: str | None = None, text: str | None = None) -> list[Command]:
    """The ``run.py`` commands ``[VAR=...] bash sweeps/<script> <args>`` makes, as its shell expands them, read from
    the script (not run): its settings (``SEEDS="${SEEDS:-0,1,2}"``) from ``env`` or their defaults, its arrays
    (``"${STUDY[@]}"``), ``"$@"`` the arguments; a variable the script sets itself (``$config``, the fractional
    design's) stays as written. toy_studies.sh's commands are those of the studies it names (``all``, or none: every
    study; :mod:`dapo_exp.analysis.studies`), with the arguments after ``--``. Raises ValueError for a study it does
    not have (the script exits 2). The test above checks this reading against each script as a shell runs it."""
    env, args = env or {}, list(args)
    where = where or f"sweeps/{script.name}"
    text = text or shlex.join(["bash", f"sweeps/{script.name}", *args])
    lines = [line.strip() for line in script.read_text().replace("\\\n", " ").splitlines()]
    variables: dict[str, str] = {}
    arrays: dict[str, list[str]] = {}
    for line in lines:
        if m := SCRIPT_SETTING.match(line):
            variables[m[1]] = env.get(m[1], m[2])
        elif m := SCRIPT_ARRAY.match(line):
            arrays[m[1]] = shell_split(m[2])
    if script.name == "toy_studies.sh":
        from dapo_exp.analysis.studies import STUDIES

        names = args[:args.index("--")] if "--" in args else args
        overrides = args[len(names) + 1:]
        out = []
        for name in (list(STUDIES) if not names or names[0] == "all" else names):
            if placeholder(name):
                continue
            if name not in STUDIES:
                raise ValueError(f"{where}: `{text}`: toy_studies.sh has no study {name!r} ({', '.join(STUDIES)}; "
                                 "overrides go after --)")
            words = shell_split(STUDIES[name].command(variables.get("SEEDS", "0,1,2,3,4")))[1:]
            out.append(Command(where, text, (*words, *overrides)))
        return out
    out = []
    for line in lines:
        if not line.startswith('"$PY" run.py'):
            continue
        words: list[str] = []
        for w in shell_split(line)[1:]:
            if w == "$@":
                words += args
            elif m := re.fullmatch(r"\$\{(\w+)\[@\]\}", w):
                words += arrays[m[1]]
            else:
                words += expand([w], variables)
        out.append(Command(where, text, tuple(words)))
    return out


def _same_call(read: list[str], ran: list[str]) -> bool:
    """``read`` (:func:`script_runs`) is the call ``ran``, a ``$variable`` the script sets itself standing for any
    words."""
    hole = next((i for i, w in enumerate(read) if re.fullmatch(r"\$\w+", w)), None)
    if hole is None:
        return read == ran
    head, tail = read[:hole], read[hole + 1:]
    return ran[:len(head)] == head and (not tail or ran[-len(tail):] == tail)


def script_invocations(path: Path, root: Path = ROOT) -> list[Command]:
    """The ``run.py`` commands of every ``[VAR=...] [time] bash sweeps/<x>.sh <args>`` of ``path`` (its shell blocks
    and its inline code spans), as the script makes them (:func:`script_runs`); a ``[word]`` argument is a
    synopsis' optional part, left out."""
    out: list[Command] = []
    for where, text, _, cmd in snippet_commands(path, root):
        n = next((i for i, w in enumerate(cmd) if not ASSIGNMENT.match(w)), len(cmd))
        env, argv = dict(a.split("=", 1) for a in cmd[:n]), cmd[n:]
        argv = argv[1:] if argv[:1] == ["time"] else argv
        if len(argv) >= 2 and argv[0] == "bash" and (m := SWEEP_SCRIPT.match(argv[1])) \
                and (ROOT / "sweeps" / m[1]).is_file():
            args = [a for a in argv[2:] if not re.fullmatch(r"\[[^\[\]]*\]", a)]
            out += script_runs(ROOT / "sweeps" / m[1], args, env, where, text.strip())
    return out


def documented_sweeps() -> list[Command]:
    """Every documented command that may launch a sweep: the python commands of the README, the docs and
    sweeps/README.md, the ``bash sweeps/<x>.sh`` calls there as the scripts make them, and each script's own
    commands (called with no arguments)."""
    return [*doc_commands(), *markdown_commands(NOTEBOOK),
            *[c for path in (*DOC_FILES, NOTEBOOK) for c in script_invocations(path)],
            *[c for s in SCRIPTS for c in script_runs(s)]]


def sweep_folder(cmd: Command) -> str | None:
    """The folder a ``python run.py -m`` command writes: ``hydra.sweep.dir=``, else ``multirun/`` and its ``sweep=``
    (the last one given: Hydra keeps the last value of a key, so a script's caller overrides it), else the name
    run.py gives it; None for a single run, a dry run, or a name the reader supplies."""
    from dapo_exp.hydra_setup import default_sweep_name

    args = list(cmd.words[1:])
    if cmd.words[0] != "run.py" or not {"-m", "--multirun"} & set(args) or any(a.startswith(("--cfg", "-c")) for a in args):
        return None
    given = [a.split("=", 1)[1].strip("'\"") for a in args if a.startswith("hydra.sweep.dir=")]
    if given:
        return None if placeholder(given[-1]) else given[-1]
    named = [a.split("=", 1)[1] for a in args if a.startswith("sweep=")]
    name = named[-1] if named else default_sweep_name(args)
    return None if name is None or placeholder(name) else f"multirun/{name.strip(chr(39) + chr(34))}"


# Folders two documented studies write today, each with why. Strict: an entry that no longer collides fails, so that
# it is removed.
KNOWN_SHARED: dict[str, str] = {}


def test_every_documented_example_writes_its_own_sweep_folder():
    """The commands of the docs, of the recipes' page and of the scripts under sweeps/ that write one folder run one
    study: they differ only in seeds and in where their jobs run (more seeds, the same command again, another
    launcher). Two examples in one folder mix their runs in one table, or one finds the other's runs finished and
    trains nothing (or the launch check refuses the second: a sweep folder holds one sweep)."""
    studies: dict[str, dict[frozenset, list[str]]] = defaultdict(lambda: defaultdict(list))
    for cmd in documented_sweeps():
        if (folder := sweep_folder(cmd)) is not None:
            study = frozenset(a for a in cmd.words[1:] if a not in ("-m", "--multirun") and not a.startswith(NOT_THE_STUDY))
            studies[folder][study].append(cmd.where)
    assert len(studies) > 10, sorted(studies)
    shared = {folder: {" ".join(sorted(k)): v for k, v in by.items()} for folder, by in studies.items() if len(by) > 1}
    known = {folder: shared.pop(folder) for folder in KNOWN_SHARED if folder in shared}
    assert set(known) == set(KNOWN_SHARED), \
        f"KNOWN_SHARED entries no longer shared: remove them ({set(KNOWN_SHARED) - set(known)})"
    assert not shared, "\n".join(f"{folder}: {by}" for folder, by in shared.items())


def test_the_folder_check_reads_a_scripts_call_as_its_shell_runs_it(tmp_path):
    """SEEDS= and ARMS= from the caller, its arguments where the script has "$@" (so its sweep= wins), a
    ``hydra.sweep.dir=`` the folder, a synopsis' ``[optional]`` part left out, toy_studies.sh's studies."""
    page = tmp_path / "p.md"
    page.write_text("```bash\nSEEDS=0,1,2,3,4 bash sweeps/four_presets.sh train.steps=60 sweep=four_presets_60\n```\n"
                    "Then `ARMS=grpo,rloo bash sweeps/family.sh hydra.sweep.dir=/tmp/f`, "
                    "`time bash sweeps/four_presets.sh [hydra/launcher=basic]` and "
                    "`bash sweeps/toy_studies.sh clip_higher -- logger=none`.\n")
    (presets, family, plain, study) = script_invocations(page, tmp_path)
    assert presets.where == "p.md:2"
    assert presets.words[-3:] == ("seed=0,1,2,3,4", "train.steps=60", "sweep=four_presets_60")
    assert sweep_folder(presets) == "multirun/four_presets_60"
    assert "fixes=grpo,rloo" in family.words and sweep_folder(family) == "/tmp/f"
    assert sweep_folder(plain) == "multirun/four_presets" and plain.words[-1] == "seed=0,1,2"
    assert sweep_folder(study) == "multirun/toy_clip_clip_higher" and study.words[-1] == "logger=none"
    page.write_text("`bash sweeps/toy_studies.sh clip_higher train.steps=5`\n")
    with pytest.raises(ValueError, match="no study 'train.steps=5'"):
        script_invocations(page, tmp_path)


def test_each_sweep_script_passes_its_callers_overrides_last():
    """Each run.py call of a recipe ends with the caller's arguments ("$@"), after the script's own settings, so
    that an override given to the script (sweep=, hydra.sweep.dir=, a key the script sets) is the one Hydra keeps."""
    for script in SCRIPTS:
        for cmd in script_runs(script, ["--", "sweep=mine"] if script.name == "toy_studies.sh" else ["sweep=mine"]):
            assert cmd.words[-1] == "sweep=mine", f"sweeps/{script.name}: {shlex.join(cmd.words)}"


# --------------------------------------------------------------------------- #
# The advice the command lines print                                           #
# --------------------------------------------------------------------------- #
def _checked(commands: list[Command]) -> None:
    assert commands
    failures = [failure(c, why) for c in commands if (why := check(c)) is not None]
    assert not failures, "\n".join(failures)


def test_the_command_plan_prints_to_add_seeds_runs_when_pasted(tmp_path, monkeypatch):
    """The runs were started without sweep=: run.py named the sweep, quoted for Hydra
    (``sweep='fixes=grpo,clip'``), and that is what their overrides record."""
    from fixtures_runs import make_run

    from dapo_exp.analysis.planning import format_plan, plan

    sweep = tmp_path / "multirun" / "fixes=grpo,clip"
    accs = {"grpo": (0.50, 0.53, 0.48), "clip": (0.56, 0.55, 0.61)}
    for preset, by_seed in accs.items():
        for seed, acc in enumerate(by_seed):
            make_run(sweep / f"fixes={preset},seed={seed}", preset, seed, final_acc=acc,
                     overrides=[f"seed={seed}", f"fixes={preset}", "sweep='fixes=grpo,clip'"])
    text = format_plan(plan(str(sweep), delta=1.0))
    commands = commands_in(text, "plan's output")
    runs = [c for c in commands if "run.py" in c.words]  # (the other: the sequential benchmark it cites)
    assert runs and all("sweep='fixes=grpo,clip'" in c.words for c in runs), text
    monkeypatch.chdir(tmp_path)
    _checked(commands)


def test_the_one_seed_line_of_an_analysis_names_a_command_that_runs(tmp_path, monkeypatch):
    import pandas as pd
    from fixtures_runs import make_run

    from dapo_exp.analysis.verdicts import one_seed_line, rerun_command

    sweep = tmp_path / "multirun" / "s"
    paths = [make_run(sweep / f"fixes={p},seed=0", p, 0, final_acc=0.5,
                      overrides=["seed=0", f"fixes={p}", "sweep='fixes=grpo,clip'"])["dir"] for p in ("grpo", "clip")]
    runs = pd.DataFrame({"path": [str(p) for p in paths], "preset": ["grpo", "clip"], "sweep": ["s", "s"]})
    table = pd.DataFrame({"n": [1, 1]})
    line = one_seed_line(table, runs)
    commands = commands_in(line, "the one-seed line")
    assert commands[0].words[:4] == ("run.py", "-m", "fixes=grpo,clip", "sweep='fixes=grpo,clip'"), line
    assert commands[0].words[4].startswith("seed=0,1,2,"), line
    assert rerun_command(runs, 3).endswith("\"sweep='fixes=grpo,clip'\" seed=0,1,2")
    monkeypatch.chdir(tmp_path)
    _checked(commands)


def test_the_studies_commands_run_when_pasted(tmp_path, monkeypatch):
    from dapo_exp.analysis.studies import STUDIES

    monkeypatch.chdir(tmp_path)
    commands = []
    for study in STUDIES.values():
        for text in (study.command(), study.control_command()):
            commands += commands_in(text, f"study {study.name}") if text else []
    _checked(commands)


@pytest.mark.slow
def test_the_help_and_the_messages_of_the_package_hold_commands_that_run(tmp_path, monkeypatch):
    """``run.py --help``'s commands (conf/hydra/help/dapo.yaml) and every command written in a string of
    the package's code (not a docstring): error messages, hints, the analysis' pointers."""
    monkeypatch.chdir(tmp_path)
    help_text = (CONF / "hydra" / "help" / "dapo.yaml").read_text()
    commands = commands_in(help_text, "conf/hydra/help/dapo.yaml")
    for path in [ROOT / "run.py", *sorted((ROOT / "dapo_exp").rglob("*.py")),
                 *sorted((ROOT / "hydra_plugins").rglob("*.py"))]:
        commands += [Command(f"{path.relative_to(ROOT)} (a message)", c.text, c.words)
                     for text in message_strings(path) for c in commands_in(text, "")]
    assert len(commands) > 10
    _checked(commands)


def message_strings(path: Path) -> list[str]:
    """The string constants of ``path`` that are not docstrings, an f-string's fields written as ``<x>``
    (a placeholder: left out of the checks)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    parts = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            out.append("".join(v.value if isinstance(v, ast.Constant) else "<x>" for v in node.values))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings | parts:
            out.append(node.value)
    return [s for s in out if "python run.py" in s or "python -m dapo_exp" in s]


def test_a_refusals_advice_is_a_command_that_is_then_accepted(tmp_path, monkeypatch):
    """The GPU-hour refusal names the seeds to add; the parse error names the quoting; both then pass."""
    from dapo_exp.cli_errors import parse_error

    monkeypatch.chdir(tmp_path)
    sweep = ("run.py", "-m", "experiment=qwen1.5b_dapo_math", "fixes=grpo,clip,clip_ds,full")
    why = check(Command("advice", "", sweep))
    assert why and "~120 GPU-hours" in why and "seed=0,1,2,3,4" in why and "seed=0 for one" in why, why
    for seeds in ("seed=0,1,2,3,4", "seed=0"):
        assert check(Command("advice", "", (*sweep, seeds))) is None
    line = parse_error("sweep=fixes=grpo,clip", "mismatched input '=' expecting <EOF>")
    quoted = re.search(r'"sweep=[^"]+"', line).group(0)
    assert check(Command("advice", "", ("run.py", "-m", "fixes=grpo,clip", *shell_split(quoted)))) is None

