"""Tasks for a real instruct model: prompts as message lists (system, worked examples, question) rendered by
the model's chat template, in the generated ``chat_arith`` levels and in the JSONL loader; the ``Answer:`` line
and ``\\boxed{}`` scored; each level's base pass@1 on SmolLM2-135M-Instruct held in bands."""

import json
import re

import pytest

from dapo_exp.hydra_setup import compose_config
from dapo_exp.tasks import load_task
from dapo_exp.tasks.base import render_prompt
from dapo_exp.tasks.chat_arith import LEVELS

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _task(*overrides):
    return compose_config(["task=chat_arith", "logger=none", "task.arith_n_train=200", "task.arith_n_eval=40",
                           *overrides]).task


def _value(solution: str) -> int:
    """The last line of a worked solution, ``a op b = c``, checked and returned: c."""
    *_, last = solution.splitlines()
    lhs, rhs = last.split(" = ")
    a, op, b = lhs.split(" ")
    assert {"+": int(a) + int(b), "-": int(a) - int(b), "x": int(a) * int(b)}[op] == int(rhs), last
    return int(rhs)


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_every_level_generates_right_answers_with_worked_solutions(level):
    data = load_task(_task(f"task.level={level}"))
    assert len(data.train) == 200 and len(data.eval) == 40
    for p in data.train + data.eval:
        assert str(_value(p.meta["solution"])) == p.answer
        for line in p.meta["solution"].splitlines():  # every step is right, not only the last
            _value(line)
        # the working starts from the question's first number
        assert p.meta["solution"].split(" ")[0] == re.findall(r"\d+", p.prompt)[0]


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_held_out_questions_are_never_trained_on_nor_shown_as_examples(level):
    data = load_task(_task(f"task.level={level}", "task.arith_n_eval=30"))
    held = {p.prompt for p in data.eval}
    assert len(held) == len(data.eval)  # distinct
    assert not held & {p.prompt for p in data.train}
    shots = [m["content"] for m in data.eval[0].messages if m["role"] == "user"][:-1]
    assert len(shots) == 3 and not held & set(shots)


def test_problems_are_a_function_of_the_seed_alone():
    a, b = load_task(_task()), load_task(_task())
    assert [(p.prompt, p.answer) for p in a.train] == [(p.prompt, p.answer) for p in b.train]
    c = load_task(_task("task.arith_seed=99"))
    assert [p.prompt for p in a.eval] != [p.prompt for p in c.eval]


def test_a_problem_is_a_conversation_system_worked_examples_then_the_question():
    data = load_task(_task("task.few_shot=2", "task.system_prompt=Be brief."))
    p = data.eval[0]
    roles = [m["role"] for m in p.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    assert p.messages[0]["content"] == "Be brief." and p.messages[-1]["content"] == p.prompt
    for shot in p.messages[2:5:2]:  # each worked example ends in the line the reward reads
        assert re.fullmatch(r"(?s).*\nAnswer: -?\d+", shot["content"])
    # the examples are the same for every problem (one prompt prefix for the whole task)
    assert all(q.messages[:-1] == p.messages[:-1] for q in data.train + data.eval)
    none = load_task(_task("task.few_shot=0", "task.system_prompt=null")).eval[0]
    assert none.messages == [{"role": "user", "content": none.prompt}]


def test_an_unknown_level_and_too_many_held_out_problems_are_refused_naming_the_key():
    with pytest.raises(ValueError, match="task.level='hard'.*add1"):
        load_task(_task("task.level=hard"))
    with pytest.raises(ValueError, match="task.level: cannot draw 500 held-out"):  # add1 has 81 problems
        load_task(_task("task.level=add1", "task.arith_n_eval=500"))


def test_messages_render_through_the_chat_template_and_as_plain_text_without_one():
    from dapo_exp.models import build_qwen_char_tokenizer

    tok = build_qwen_char_tokenizer(vocab_size=200, chat_template=CHATML)
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "1+2"},
            {"role": "assistant", "content": "Answer: 3"}, {"role": "user", "content": "2+2"}]
    text = tok.decode(render_prompt(msgs, tok, True))
    assert text == ("<|im_start|>system\ns<|im_end|>\n<|im_start|>user\n1+2<|im_end|>\n<|im_start|>assistant\n"
                    "Answer: 3<|im_end|>\n<|im_start|>user\n2+2<|im_end|>\n<|im_start|>assistant\n")
    # a text prompt is the one user message it always was
    assert render_prompt("2+2", tok, True) == render_prompt([{"role": "user", "content": "2+2"}], tok, True)
    plain = render_prompt(msgs, tok, False)
    assert plain[0] == tok.bos_token_id and tok.decode(plain[1:]) == "s\n\n1+2\n\nAnswer: 3\n\n2+2"


@pytest.mark.parametrize("which", ["toy", "smollm2"])
def test_prompts_rendered_in_one_tokenizer_call_are_the_ids_of_rendering_each_alone(which, request):
    """build_run renders a task's prompts in one call (render_prompts): the ids are the ones the tokenizer's own
    apply_chat_template(tokenize=True) gives each prompt, and the plain form's BOS + text, on the toy's character
    tokenizer and on SmolLM2's."""
    from transformers import AutoTokenizer

    from dapo_exp.models import build_qwen_char_tokenizer
    from dapo_exp.tasks.base import render_prompts

    if which == "toy":
        tok = build_qwen_char_tokenizer(vocab_size=200, chat_template=CHATML)
        problems = load_task(_task("task.level=add1")).train[:40]
    else:
        tok = AutoTokenizer.from_pretrained(request.getfixturevalue("smollm2_dir"))
        problems = [p for level in ("add2", "word1") for p in load_task(_task(f"task.level={level}")).train[:20]]
    prompts = [p.messages for p in problems] + ["What is 1 + 1?", [{"role": "user", "content": "x"}]]
    alone = []
    for p in prompts:
        msgs = [{"role": "user", "content": p}] if isinstance(p, str) else p
        out = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        alone.append(list(out["input_ids"] if hasattr(out, "input_ids") or isinstance(out, dict) else out))
    assert render_prompts(prompts, tok, True) == alone
    plain = render_prompts(prompts, tok, False)
    for p, ids in zip(prompts, plain):
        text = p if isinstance(p, str) else "\n\n".join(m["content"] for m in p)
        assert ids == [tok.bos_token_id] + tok(text, add_special_tokens=False)["input_ids"]
    assert render_prompts([], tok, True) == []


def test_the_jsonl_loader_keeps_a_message_list_and_the_paper_form_stays_one_message(tmp_path):
    rows = [
        {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 1 + 1?"},
                    {"role": "assistant", "content": "Answer: 2"}, {"role": "user", "content": "What is 2 + 5?"}],
         "reward_model": {"ground_truth": "7"}, "extra_info": {"index": 0}},
        {"prompt": [{"role": "user", "content": "What is 3 + 3?"}], "reward_model": {"ground_truth": "6"},
         "extra_info": {"index": 1}},
        {"prompt": [{"role": "narrator", "content": "x"}, {"role": "user", "content": "What is 4 + 4?"}],
         "reward_model": {"ground_truth": "8"}, "extra_info": {"index": 2}},
        # the same question after other examples: another problem, not a duplicate
        {"prompt": [{"role": "user", "content": "What is 9 + 9?"}, {"role": "assistant", "content": "Answer: 18"},
                    {"role": "user", "content": "What is 2 + 5?"}],
         "reward_model": {"ground_truth": "7"}, "extra_info": {"index": 3}},
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = load_task(compose_config(["task=dapo_math", f"task.train_source={path}", f"task.eval_source={path}",
                                     "logger=none"]).task)
    by_answer = {p.id: p for p in data.eval}
    assert len(data.eval) == 3 and data.stats["eval_malformed_skipped"] == 1  # the unknown role
    first = by_answer["chat-0"]
    assert [m["role"] for m in first.messages] == ["system", "user", "assistant", "user"]
    assert first.prompt == "What is 2 + 5?" and first.conversation() == first.messages
    assert by_answer["chat-1"].messages is None  # one user message: the paper's form, unchanged
    assert by_answer["chat-1"].conversation() == [{"role": "user", "content": "What is 3 + 3?"}]


def test_a_system_prompt_is_put_before_every_one_message_problem(tmp_path):
    path = tmp_path / "plain.jsonl"
    path.write_text(json.dumps({"prompt": [{"role": "user", "content": "Q?"}], "reward_model": {"ground_truth": "1"}})
                    + "\n")
    task = compose_config(["task=dapo_math", f"task.train_source={path}", f"task.eval_source={path}",
                           "task.system_prompt=Think.", "logger=none"]).task
    p = load_task(task).train[0]
    assert p.messages == [{"role": "system", "content": "Think."}, {"role": "user", "content": "Q?"}]


def test_verl_gets_each_problems_whole_conversation(tmp_path):
    import pandas as pd

    from dapo_exp.backends.verl_launch import export_data

    cfg = compose_config(["task=chat_arith", "task.arith_n_train=10", "task.arith_n_eval=4", "logger=none"])
    export_data(cfg, tmp_path)
    got = pd.read_parquet(tmp_path / "verl_data" / "eval.parquet")
    want = load_task(cfg.task).eval
    assert [list(map(dict, row)) for row in got["prompt"]] == [p.messages for p in want]


@pytest.mark.parametrize("response, truth, correct", [
    ("47 + 25 = 72\nAnswer: 72", "72", True),
    ("The sum is \\boxed{72}.", "72", True),  # no Answer: line: the last box
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", True),
    ("\\boxed{1,000} dollars", "1000", True),  # normalised as the Answer: line is
    ("Answer: 71\nor \\boxed{72}", "72", False),  # an Answer: line wins over a box
    ("\\boxed{70} then \\boxed{72}", "72", True),  # the last box
    ("\\boxed{7", "7", False),  # left open: no answer
    ("\\boxed{{7}", "7", False),
    ("72", "72", False),  # a bare number is no answer
])
def test_answer_or_boxed_reads_the_answer_line_else_the_last_box(response, truth, correct):
    from dapo_exp.tasks.verifier import get_verifier

    with get_verifier("answer_or_boxed", 5.0, 1) as v:
        assert v.verify(response, truth).correct is correct
    with get_verifier("math_dapo", 5.0, 1) as v:  # the paper's rule is unchanged: never a box
        assert v.verify(response, truth).correct is (correct and "Answer:" in response)


# ------------------------------------------------------------------ base pass@1 on SmolLM2-135M-Instruct
# Each level's base policy at experiment=smollm2_add2's sampling (temperature 1, a 32-token cap, three worked
# examples), measured 2026-11-28 with `python -m dapo_exp.benchmarks.probe --problems 32 --k 4` (pass@1 with a 95%
# interval over problems; the share of responses with an Answer: line; the share cut at the cap):
#   add1 0.758 [0.649, 0.867] line 0.97 | add2 0.344 [0.210, 0.477] line 0.97 | add3 0.070 [0.031, 0.110] line
#   0.73, cut 0.28 | mul 0.000 line 0.27, cut 0.88 (its three-line working needs about 45 tokens) | word1 0.320
#   [0.232, 0.409] line 0.84 | word2 0.078 [0.032, 0.124] line 0.94.
# The test samples 16 problems x 2 (half the samples of x 4; measured at 09e87e2, 2026-11-29, `--problems 16 --k 2`:
#   add1 0.750 line 0.94 | add2 0.438 line 0.91 | add3 0.031 line 0.69 | mul 0.000 line 0.25 | word1 0.375 line 0.78
#   | word2 0.000 line 0.88): the bands hold the 32-problem intervals above, widened for half the problems.
BASE_BANDS = {
    "add1": {"acc": (0.50, 0.95), "answer_line": (0.85, 1.0)},
    "add2": {"acc": (0.12, 0.60), "answer_line": (0.85, 1.0)},
    "add3": {"acc": (0.0, 0.25), "answer_line": (0.45, 0.95)},
    "mul": {"acc": (0.0, 0.08), "answer_line": (0.05, 0.55)},
    "word1": {"acc": (0.12, 0.55), "answer_line": (0.65, 1.0)},
    "word2": {"acc": (0.0, 0.25), "answer_line": (0.8, 1.0)},
}


# What each band was measured on: the 16 problems the test samples (their messages and answers), the sampling
# settings, the verifier and the model's pinned weights, as a digest (`_probe_inputs_digest`). CI samples one level
# (add2, experiment=smollm2_add2's own: about 45 CPU-s each on the slowest CI machine, six of them a sixth of CI's
# budget); the digest test holds the other five to what was measured: a change of their prompts, problems,
# sampling or weights fails it until the band is measured again with the command in its message (all six:
# `bin/python -m pytest tests/test_chat_tasks.py -k base_pass_at_1 --all-bands`, or the probe above).
BANDS_MEASURED_ON = {  # the same at 09e87e2, where the 16 x 2 values above were measured
    "add1": "a8fe32193cfc4692", "add2": "1b815405d11f97cf", "add3": "61b30d9472b795aa",
    "mul": "99cbe096b66bc5d4", "word1": "5f5d7ae8fb3048f5", "word2": "9995ae32b73c641c",
}
BAND_IN_CI = ("add2",)


def _probe_inputs_digest(level: str) -> str:
    import hashlib

    from dapo_exp.packaged_models import SMOLLM2_135M

    cfg = compose_config(["experiment=smollm2_add2", f"task.level={level}", "logger=none"])
    r = cfg.rollout
    inputs = {"weights": [cfg.model.path, SMOLLM2_135M.requirement, SMOLLM2_135M.member_sha256],
              "problems": [[p.messages or p.prompt, p.answer] for p in load_task(cfg.task).eval[:16]],
              "sampling": [r.engine, r.max_response_len, r.temperature, r.top_p],
              "verifier": cfg.task.verifier, "chat_template": bool(cfg.task.chat_template)}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def test_every_level_has_a_band():
    assert set(BASE_BANDS) == set(LEVELS) == set(BANDS_MEASURED_ON)


@pytest.mark.parametrize("level", sorted(BASE_BANDS))
def test_each_band_was_measured_on_the_levels_current_prompts_and_sampling(level):
    got = _probe_inputs_digest(level)
    assert got == BANDS_MEASURED_ON[level], (
        f"{level}: the probe's inputs (its 16 problems' messages and answers, the sampling settings, the verifier "
        f"or the weights) changed since its band was measured: measure it again (bin/python -m "
        f"dapo_exp.benchmarks.probe --levels {level} --problems 16 --k 2), update BASE_BANDS if it moved, and "
        f"set BANDS_MEASURED_ON[{level!r}] = {got!r}")


def test_the_digest_sees_a_changed_problem_and_a_changed_sampling_setting(monkeypatch):
    """The guard has teeth: another temperature, or one problem's text changed, gives another digest."""
    import dapo_exp.tasks as tasks

    before = _probe_inputs_digest("add1")
    real = tasks.load_task

    def one_changed(cfg_task):
        task = real(cfg_task)
        task.eval[0].answer = f"{task.eval[0].answer}0"
        return task

    monkeypatch.setattr(f"{__name__}.load_task", one_changed)
    assert _probe_inputs_digest("add1") != before
    monkeypatch.undo()
    compose = compose_config
    monkeypatch.setattr(f"{__name__}.compose_config", lambda overrides: compose([*overrides, "rollout.temperature=0.9"]))
    assert _probe_inputs_digest("add1") != before


@pytest.mark.slow
@pytest.mark.parametrize("level", sorted(BASE_BANDS))
def test_each_levels_base_pass_at_1_on_smollm2_is_in_its_band(level, smollm2_dir, request):
    if level not in BAND_IN_CI and not request.config.getoption("--all-bands"):
        pytest.skip(f"{level}: not sampled by default (its inputs are held to those its band was measured on, "
                    f"test_each_band_was_measured_on_the_levels_current_prompts_and_sampling); --all-bands samples it")
    from dapo_exp.benchmarks.probe import probe

    cfg = compose_config(["experiment=smollm2_add2", f"task.level={level}", "logger=none"])
    got = probe(cfg, problems=16, k=2)
    print(level, got)  # pytest -s: the measured values
    outside = {k: (round(got[k], 3), band) for k, band in BASE_BANDS[level].items() if not band[0] <= got[k] <= band[1]}
    assert not outside, f"{level}: base policy outside its bands (value, band): {outside}; all: {got}"


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_every_levels_prompts_fit_the_prompt_caps_on_smollm2s_tokenizer(level, smollm2_dir):
    """Natively ``task.max_prompt_len`` is a cap (a longer prompt is left-truncated); on verl it is also the
    length every prompt is padded to, so the presets keep it tight. Every prompt of every level, rendered by
    SmolLM2's chat template, fits the task's cap, and add2's fit ``experiment=smollm2_add2``'s."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    task = compose_config(["task=chat_arith", "logger=none", f"task.level={level}", "task.arith_n_train=2000"]).task
    data = load_task(task)
    longest = max(len(render_prompt(p.conversation(), tok, True)) for p in data.train + data.eval)
    assert longest <= task.max_prompt_len, (level, longest, task.max_prompt_len)
    if level == "add2":
        preset = compose_config(["experiment=smollm2_add2", "logger=none"]).task
        assert longest <= preset.max_prompt_len, (longest, preset.max_prompt_len)
