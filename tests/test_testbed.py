"""The CPU testbed (issue 11): the warm start's strategy mix, the mechanism diagnostics, the
regime presets, and the base-policy properties each regime needs (docs/explanation/testbed.md).

The base-policy tests build each regime's warm-started policy once (cached like `python run.py`)
and sample it: a later change to the task, the warm start or the sampler that breaks a regime
fails here, not in a sweep an hour later.
"""

from __future__ import annotations

import random
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from helpers import CONF
from hydra import compose, initialize_config_dir

from dapo_exp.analysis.studies import STUDIES, study_table
from dapo_exp.tasks.arith import STEP_MARKER, arith_diagnostics, is_degenerate, on_correct_path, response_style
from dapo_exp.tasks.arith_warmstart import GUESS_OFFSETS, warmstart_text
from dapo_exp.tasks.base import Problem

REGIMES = ("toy_headroom", "toy_ds", "toy_clip", "toy_overlong", "toy_degeneration", "toy_dapo")
P = Problem(id="t0", prompt="7+8+3+9\n", answer="27", meta={"steps": ["7+8=15", "15+3=18", "18+9=27"]})


def _mix(**kw):
    base = dict(warmstart_guess_frac=0.0, warmstart_guess_off_frac=0.0, warmstart_wrong_frac=0.0,
                warmstart_long_frac=0.0, warmstart_loop_frac=0.0, warmstart_step_marker=False)
    return SimpleNamespace(**{**base, **kw})


# ------------------------------------------------------------------ diagnostics
def test_response_style_reads_the_first_line():
    assert response_style("Answer: 27") == "guess"
    assert response_style("7+8=15\n15+3=18\nAnswer: 18") == "step"
    assert response_style("hmm wait\n7+8=15") == "other"
    assert response_style("") == "other"


def test_degenerate_means_a_line_three_times():
    assert is_degenerate("7+8=15\n15+3=18\n15+3=18\n15+3=18")
    assert not is_degenerate("7+8=15\n15+3=18\n15+3=18\nAnswer: 18")


def test_on_correct_path_follows_the_reference_and_forgives_the_cut_line():
    steps = P.meta["steps"]
    assert on_correct_path("7+8=15\n15+3=18\n18+9=2", steps, truncated=True)  # cut mid-line: on the path
    assert on_correct_path("7+8=15\n15+3=18\n18+9=27\nAnswer: 27", steps, truncated=False)
    assert not on_correct_path("7+8=15\n15+3=19\n19+9=2", steps, truncated=True)  # a wrong step
    assert not on_correct_path("7+8=15\n15+3=18\n15+3=18\n15+3", steps, truncated=True)  # a loop
    assert not on_correct_path("7+8=1", steps, truncated=True)  # no complete line


def test_arith_diagnostics_shares():
    texts = ["Answer: 27", "Answer: 26", "7+8=15\n15+3=18\n18+9=27\nAnswer: 27", "7+8=15\n15+3=18\n18+",
             "7+8=15\n7+8=15\n7+8=15\n7+8"]
    d = arith_diagnostics([P] * 5, texts, [False, False, False, True, True], [True, False, True, False, False])
    assert d["style_guess"] == pytest.approx(2 / 5) and d["style_step"] == pytest.approx(3 / 5)
    assert d["guess_acc"] == pytest.approx(1 / 2) and d["step_acc"] == pytest.approx(1 / 3)
    assert d["degenerate"] == pytest.approx(1 / 5)
    assert d["style_step_long"] == 0.0  # P has 3 steps: not long
    long_p = Problem(id="t1", prompt="1+1+1+1+1\n", answer="5", meta={"steps": ["1+1=2", "2+1=3", "3+1=4", "4+1=5"]})
    d2 = arith_diagnostics([P, long_p, long_p], ["Answer: 1", "1+1=2\n2+1=3", "Answer: 5"], [False, True, False],
                           [False, False, True])
    assert d2["style_step_long"] == pytest.approx(1 / 2)
    assert d["trunc_on_path"] == pytest.approx(1 / 5) and d["trunc_on_path_of_trunc"] == pytest.approx(1 / 2)


# ------------------------------------------------------------------ warm-start mix
def test_warmstart_mix_draws_each_strategy_at_its_share():
    rng, cfg = random.Random(0), _mix(warmstart_guess_frac=0.6, warmstart_guess_off_frac=0.7,
                                      warmstart_loop_frac=0.25)
    texts = [warmstart_text(rng, P, cfg, cap=32) for _ in range(20000)]
    styles = Counter(map(response_style, texts))
    assert styles["guess"] / 20000 == pytest.approx(0.6, abs=0.015)
    guesses = [int(t.split()[-1]) for t in texts if response_style(t) == "guess"]
    off = [g - 27 for g in guesses if g != 27]
    assert len(off) / len(guesses) == pytest.approx(0.7, abs=0.02) and set(off) == set(GUESS_OFFSETS)
    steps = [t for t in texts if response_style(t) == "step"]
    loops = [t for t in steps if is_degenerate(t)]
    assert len(loops) / len(steps) == pytest.approx(0.25, abs=0.02)
    assert all("Answer" not in t and len(t) >= 32 for t in loops)  # a loop runs past the cap, no answer
    starts = Counter(next(i for i, x in enumerate(t.split("\n")) if t.split("\n").count(x) > 1) for t in loops)
    assert set(starts) == {0, 1, 2}  # it can start at any step, mid-response included
    clean = [t for t in steps if not is_degenerate(t)]
    assert set(clean) == {"7+8=15\n15+3=18\n18+9=27\nAnswer: 27"}  # no wrong answers unless asked


def test_step_marker_opens_step_solutions_and_is_read_back():
    rng = random.Random(1)
    texts = [warmstart_text(rng, P, _mix(warmstart_guess_frac=0.5, warmstart_step_marker=True), cap=32)
             for _ in range(200)]
    steps = [t for t in texts if response_style(t) == "step"]
    assert steps and all(t.startswith("Steps:\n7+8=15") for t in steps)
    assert on_correct_path("Steps:\n7+8=15\n15+3=1", P.meta["steps"], truncated=True)


def test_a_mangled_marker_is_counted_apart_from_the_marker():
    from dapo_exp.tasks.arith import is_mangled_marker

    texts = ["Steps:\n7+8=15", "xteps:\n7+8=15", ".teps:\n7+8=15\n15+3=18", "Answer: 27", "teps:\n7+8=15"]
    assert [is_mangled_marker(t) for t in texts] == [False, True, True, False, False]
    d = arith_diagnostics([P] * 5, texts, [False] * 5, [False] * 5)
    assert d["marker_mangled"] == pytest.approx(2 / 5) and d["style_step"] == pytest.approx(1 / 5)


def test_a_later_knob_left_at_its_default_keeps_the_cache_key():
    from dapo_exp.tasks.arith_warmstart import _warmstart_key

    cfg = _compose()
    key = _warmstart_key(cfg.model, cfg.task, 64)
    without = SimpleNamespace(**{k: v for k, v in cfg.model.items() if k != "warmstart_step_marker"},
                              warmstart_step_marker=None)
    assert _warmstart_key(without, cfg.task, 64) == key  # as if the knob did not exist
    marked = _compose("model.warmstart_step_marker=true")
    assert _warmstart_key(marked.model, marked.task, 64) != key


# ------------------------------------------------------------------ presets and studies
def _compose(*overrides):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_each_study_names_a_fix_a_regime_and_a_predicted_mechanism(name):
    from dapo_exp import fixes

    s = STUDIES[name]
    assert s.fix in fixes.FIXES and set(s.arms) <= set(fixes.FIXES[s.fix].options)
    assert any(m.sign for m in s.metrics), "a study needs at least one predicted mechanism metric"
    on = _compose(f"experiment={s.experiment}", "fixes=grpo", f"{s.fix}={s.arms[1]}")
    off = _compose(f"experiment={s.experiment}", "fixes=grpo", f"{s.fix}={s.arms[0]}")
    from dapo_exp.config import validate

    validate(on), validate(off)  # both arms run: a bad preset fails here, not after a warm start
    sw_on, sw_off = fixes.switches(on.algo), fixes.switches(off.algo)
    assert sw_on[s.fix] and not sw_off[s.fix]
    assert {k for k in sw_on if sw_on[k] != sw_off[k]} == {s.fix}  # the arms differ in this switch alone


def test_study_table_pairs_by_seed_and_gives_verdicts():
    import pandas as pd

    from dapo_exp import fixes

    s = STUDIES["clip_higher"]
    rows = []
    for seed in range(5):
        for on in (False, True):
            r = {k: False for k in fixes.switch_names()}
            r.update({"clip_higher": on, "seed": seed, "included": True, "label": "clip" if on else "grpo",
                      "avg/diag/style_step": 0.1 + 0.01 * seed + (0.05 if on else 0.0),
                      "avg/actor/entropy": 0.3 - (0.02 * seed if on else 0.0),  # lower: opposite
                      "avg/actor/pg_clipfrac_higher": 0.01 + 0.001 * ((seed * 7) % 3) * (1 if on else -1),
                      "avg/diag/marker_mangled": 0.2,
                      "final/eval/acc_avg": 0.5})
            rows.append(r)
    t = study_table(pd.DataFrame(rows), s).set_index("metric")
    assert t.loc["avg/diag/style_step", "diff"] == pytest.approx(0.05)
    assert t.loc["avg/diag/style_step", "verdict"] == "as predicted"
    assert t.loc["avg/actor/entropy", "verdict"] == "opposite"
    assert t.loc["avg/actor/pg_clipfrac_higher", "verdict"] == "no difference shown"
    assert t.loc["endpoint/eval/acc_avg", "verdict"] == "reported" and t.loc["endpoint/eval/acc_avg", "n_pairs"] == 5
    mixed = pd.DataFrame(rows).assign(dynamic_sampling=[i % 2 == 0 for i in range(10)])
    with pytest.raises(ValueError, match="dynamic_sampling"):
        study_table(mixed, s)
    with pytest.raises(ValueError, match="avg/diag/style_step"):  # a metric nobody logged is an error, not "no difference"
        study_table(pd.DataFrame(rows).drop(columns=["avg/diag/style_step"]), s)


def test_sample_diagnostics_reads_each_groups_own_problem():
    from dapo_exp.rollout.groups import Group
    from dapo_exp.steps import sample_diagnostics
    from dapo_exp.tasks import DIAGNOSTICS

    long_p = Problem(id="t1", prompt="1+1+1+1+1\n", answer="5", meta={"steps": ["1+1=2", "2+1=3", "3+1=4", "4+1=5"]})
    problems = [P, P, long_p]  # the group below is of problem 2, not 0: the index must be followed

    def group(i, texts, truncated):
        return Group(prompt_index=i, prompt_ids=[1], response_ids=[[5]] * len(texts), truncated=truncated,
                     correct=[False] * len(texts), reward=[-1.0] * len(texts), shaping={}, preds=[None] * len(texts),
                     meta={"texts": texts})

    m = sample_diagnostics([group(2, ["1+1=2\n2+1=3\n3+", "Answer: 5"], [True, False])], problems, DIAGNOSTICS["arith"])
    assert m["diag/style_step_long"] == 0.5 and m["diag/trunc_on_path"] == 0.5
    assert sample_diagnostics([], problems, DIAGNOSTICS["arith"]) == {} and sample_diagnostics([group(2, ["x"], [False])], problems, None) == {}


def test_choice_masked_only_masks_step_targets_at_the_stated_rate():
    from dapo_exp.tasks.arith_warmstart import choice_masked

    rng = random.Random(3)
    assert not any(choice_masked(rng, "Answer: 5", 0.1) for _ in range(500))
    assert not any(choice_masked(rng, "7+8=15\nAnswer: 15", 1.0) for _ in range(500))  # 1.0: nothing masked
    masked = sum(choice_masked(rng, "Steps:\n7+8=15\nAnswer: 15", 0.12) for _ in range(5000)) / 5000
    assert masked == pytest.approx(0.88, abs=0.02)


# ------------------------------------------------------------------ base policies of the regimes
def _probe(cfg, n_problems: int = 48, k: int = 8, prefix: str = "") -> dict[str, float]:
    """Sample the regime's base policy on training problems at the training sampling settings;
    ``prefix`` is appended to every prompt (the response is then its continuation). Also
    ``p_marker``: the mean over the prompts of the policy's probability of the
    :data:`~dapo_exp.tasks.arith.STEP_MARKER`'s first token at the first response position."""
    from dapo_exp.models import load_policy
    from dapo_exp.rollout import make_engine
    from dapo_exp.rollout.engine import SamplingSpec
    from dapo_exp.tasks import load_task
    from dapo_exp.tasks.arith_warmstart import ensure_tiny_checkpoint
    from dapo_exp.tasks.verifier import get_verifier

    path = ensure_tiny_checkpoint(cfg.model, cfg.task, cfg.rollout.max_response_len)
    problems = load_task(cfg.task).train[:n_problems]
    tok, model = load_policy(path, "float32", "cpu", False)
    engine = make_engine(cfg=cfg, model=model, tokenizer=tok, model_path=path)
    prompts = [[tok.bos_token_id] + tok(p.prompt + prefix, add_special_tokens=False)["input_ids"] for p in problems]
    marker = tok(STEP_MARKER, add_special_tokens=False)["input_ids"][0]
    with torch.no_grad():
        p_marker = sum(float(model(input_ids=torch.tensor([x])).logits[0, -1].softmax(-1)[marker])
                       for x in prompts) / len(prompts)
    torch.manual_seed(0)
    gens = engine.generate(prompts, SamplingSpec(n=k, max_new_tokens=cfg.rollout.max_response_len,
                                                 temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, seed=7))
    texts = tok.batch_decode(gens.response_ids, skip_special_tokens=True)
    results = get_verifier(cfg.task.verifier, 10, 1).verify_batch(texts, [p.answer for p in problems for _ in range(k)])
    correct = [bool(r.correct) for r in results]
    d = arith_diagnostics([p for p in problems for _ in range(k)], texts, list(gens.truncated), correct)
    return {**d, "acc": sum(correct) / len(correct), "truncated": sum(gens.truncated) / len(correct), "p_marker": p_marker}


# Bands each regime's base policy must sit in (48 problems x 8 samples at training sampling).
# Measured at the commit that set them (2026-11-22): headroom style_step 0.305, step_acc 0.342,
# guess_acc 0.158, acc 0.214; clip p_marker 0.009, style_step 0.005, guess_acc 0.11, acc 0.11
# (its step skill: CHOSEN_BANDS); overlong trunc_on_path 0.070, style_step_long 0.295,
# truncated 0.169; degeneration degenerate 0.208, style_step 0.648 (pytest -s prints them).
BANDS = {
    # two strategies, the step one more accurate (0.34 vs 0.16 at temperature 1 when set)
    "toy_headroom": {"style_step": (0.15, 0.45), "step_acc": (0.25, 1.0), "guess_acc": (0.0, 0.25), "acc": (0.1, 0.4)},
    # the step strategy's first token (the `Steps:` marker) a low-probability token (~1%), guesses
    # rarely right (every guess target is off: only the policy's slips hit the answer)
    "toy_clip": {"p_marker": (0.002, 0.03), "style_step": (0.0, 0.05), "guess_acc": (0.0, 0.2), "acc": (0.02, 0.25)},
    "toy_overlong": {"trunc_on_path": (0.03, 0.5), "style_step_long": (0.15, 0.5), "truncated": (0.05, 0.5)},
    "toy_degeneration": {"degenerate": (0.05, 0.4), "style_step": (0.3, 0.8)},
    # a `Steps:` choice of about 1 in 10 (toy_clip's is 1 in 100), guesses right only by slips, and the step
    # strategy's situations already in the samples (measured 2026-11-27: p_marker 0.094, style_step 0.107,
    # guess_acc 0.114, acc 0.120, truncated 0.086, trunc_on_path 0.034); once chosen: CHOSEN_BANDS
    "toy_dapo": {"p_marker": (0.03, 0.2), "style_step": (0.04, 0.2), "guess_acc": (0.0, 0.25), "acc": (0.02, 0.25),
                 "trunc_on_path": (0.01, 0.1)},
}
# The same policies once the rare strategy is chosen (the prompt ends with the STEP_MARKER line;
# 24 problems x 8 samples): toy_clip's step skill, measured 0.85 (guesses: 0.11).
CHOSEN_BANDS = {
    "toy_clip": {"style_step": (0.95, 1.0), "step_acc": (0.6, 1.0)},
    # toy_dapo once the step strategy is chosen (measured 2026-11-27): right 0.293 of the time (guesses 0.114),
    # and its situations co-occur: truncated at the 32-token cap 0.589 of the time, of which a third on a
    # correct path (trunc_on_path 0.182: Overlong Filtering's job), looping 0.042 (Token-level Loss's job)
    "toy_dapo": {"style_step": (0.9, 1.0), "step_acc": (0.15, 0.6), "truncated": (0.3, 0.9),
                 "trunc_on_path": (0.08, 0.5), "degenerate": (0.01, 0.3)},
}


@pytest.mark.parametrize("regime", sorted(BANDS))
def test_regime_base_policy_has_what_the_regime_needs(regime, warm_cache):
    cfg = _compose(f"experiment={regime}", f"model.cache_dir={warm_cache}", "logger=none")
    got = _probe(cfg)
    print(regime, {k: round(v, 3) for k, v in got.items()})  # pytest -s: the measured base policy
    outside = {k: (round(got[k], 3), band) for k, band in BANDS[regime].items() if not band[0] <= got[k] <= band[1]}
    assert not outside, f"{regime}: base policy outside its bands (value, band): {outside}; all: {got}"


@pytest.mark.parametrize("regime", sorted(CHOSEN_BANDS))
def test_regime_rare_strategy_is_skilled_once_chosen(regime, warm_cache):
    cfg = _compose(f"experiment={regime}", f"model.cache_dir={warm_cache}", "logger=none")
    got = _probe(cfg, n_problems=24, prefix=STEP_MARKER + "\n")
    print(regime, "chosen", {k: round(v, 3) for k, v in got.items()})
    outside = {k: (round(got[k], 3), band) for k, band in CHOSEN_BANDS[regime].items() if not band[0] <= got[k] <= band[1]}
    assert not outside, f"{regime}: the chosen strategy outside its bands (value, band): {outside}; all: {got}"


def test_toy_ds_is_the_headroom_regime():
    a, b = _compose("experiment=toy_ds"), _compose("experiment=toy_headroom")
    assert a == b
