"""avg@k, pass@k, maj@k and summarise_eval against hand computations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dapo_exp import rundir
from dapo_exp.evaluation import avg_at_k, maj_at_k, majority_vote, pass_at_k, summarise_eval


def test_pass_at_k_hand_values():
    assert pass_at_k(5, 2, 1) == pytest.approx(2 / 5)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)  # 1 - C(7,5)/C(10,5)
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 1, 4) == 1.0  # n - c < k: every draw holds the correct one
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5)  # binomials of ~1e58, no overflow
    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - math.comb(n - c, k) / math.comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


@pytest.mark.parametrize("n,c,k", [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_rejects_bad_arguments(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k"):
        pass_at_k(n, c, k)


def test_avg_at_k():
    assert avg_at_k([[1, 0, 0, 1], [1, 1, 1, 1], [0, 0, 0, 0]]) == pytest.approx(0.5)
    assert avg_at_k(np.array([[True, False], [True, True]])) == pytest.approx(0.75)
    assert avg_at_k([[1], [0, 1, 1]]) == pytest.approx((1 + 2 / 3) / 2)  # each problem weighs the same
    with pytest.raises(ValueError):
        avg_at_k([])


def test_majority_vote_rules():
    assert majority_vote(["5", "5", "6", None]) == ("5", 0)
    assert majority_vote([None, None, "3", None]) == ("3", 2)  # None never wins ...
    assert majority_vote([None, None]) == (None, None)  # ... unless all are None
    assert majority_vote(["7", "8", "8", "7"]) == ("7", 0)  # tie: the answer seen first
    assert majority_vote(["b", "a", "a", "b"]) == ("b", 0)  # not alphabetical


def test_maj_at_k_hand_value():
    preds = [["5", "5", "6", None], [None, None, "3", None], ["7", "8", "8", "7"], [None] * 4]
    correct = [[1, 1, 0, 0], [0, 0, 0, 0], [0, 1, 1, 0], [0, 0, 0, 0]]
    assert maj_at_k(preds, correct) == pytest.approx(1 / 4)
    assert maj_at_k([["3", "3", "4"]], [[0, 0, 1]]) == 0.0  # the minority right answer does not count


def _example():
    # 3 problems x k = 4, group-major
    correct = [1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0]
    preds = ["2", "3", "3", "2", "9", "9", "9", "9", None, "1", "1", None]
    lengths = [10, 20, 30, 40, 5, 5, 5, 5, 100, 100, 100, 100]
    truncated = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0]
    return correct, preds, lengths, truncated


def test_summarise_eval_hand_values():
    correct, preds, lengths, truncated = _example()
    out = summarise_eval(["p0", "p1", "p2"], correct, preds, lengths, truncated, 4)
    assert set(out) == {rundir.EVAL_ACC, rundir.EVAL_PASS, rundir.EVAL_MAJ, rundir.EVAL_LEN,
                        rundir.EVAL_TRUNC, "per_problem"}
    assert set(out) - {"per_problem"} == {"eval/acc_avg", "eval/pass_at_k", "eval/maj_at_k",
                                          "eval/response_len_mean", "eval/truncated_frac"}
    assert out["eval/acc_avg"] == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert out["eval/pass_at_k"] == pytest.approx(2 / 3)
    # p0: "2" vs "3" tie 2-2, "2" seen first and correct; p1: "9" correct; p2: "1" wrong
    assert out["eval/maj_at_k"] == pytest.approx(2 / 3)
    assert out["eval/response_len_mean"] == pytest.approx((100 + 20 + 400) / 12)
    assert out["eval/truncated_frac"] == pytest.approx(2 / 12)
    p0, p1, p2 = out["per_problem"]
    assert p0 == {"problem_id": "p0", "n": 4, "n_correct": 2, "acc": 0.5, "pass_at_k": 1.0, "maj_pred": "2",
                  "maj_correct": True, "len_mean": 25.0, "truncated_frac": 0.0}
    assert (p1["maj_pred"], p1["maj_correct"], p2["maj_pred"], p2["maj_correct"]) == ("9", True, "1", False)
    assert p2["truncated_frac"] == 0.5


def test_summarise_eval_accepts_arrays_tensors_and_per_sample_ids():
    import torch

    correct, preds, lengths, truncated = _example()
    ref = summarise_eval(["p0", "p1", "p2"], correct, preds, lengths, truncated, 4)
    ids_per_sample = [f"p{i // 4}" for i in range(12)]
    out = summarise_eval(ids_per_sample, np.array(correct, bool), preds, torch.tensor(lengths), torch.tensor(truncated,
                         dtype=torch.bool), 4)
    assert out == ref


def test_summarise_eval_shape_errors():
    correct, preds, lengths, truncated = _example()
    with pytest.raises(ValueError, match="multiple of k=5"):
        summarise_eval(["p0", "p1", "p2"], correct, preds, lengths, truncated, 5)
    with pytest.raises(ValueError, match="2 problem_ids for 3 problems"):
        summarise_eval(["p0", "p1"], correct, preds, lengths, truncated, 4)
    with pytest.raises(ValueError, match="lengths has 11 entries"):
        summarise_eval(["p0", "p1", "p2"], correct, preds, lengths[:-1], truncated, 4)


# --------------------------------------------------------------------------- #
# The endpoint: the final evaluation's size and the summary's record            #
# --------------------------------------------------------------------------- #
def _eval_cfg(**kw):
    from omegaconf import OmegaConf

    from dapo_exp.config import EvalConfig

    c = OmegaConf.structured(EvalConfig)
    for k, v in kw.items():
        c[k] = v
    return c


def test_eval_size_final_and_intermediate():
    from dapo_exp.evaluation import eval_size

    assert eval_size(_eval_cfg(), False, 256) == (64, 4) and eval_size(_eval_cfg(), True, 256) == (256, 8)  # the toy's
    flat = _eval_cfg(problems=None, final_problems=None, final_samples=None)  # the real-scale presets'
    assert eval_size(flat, False, 64) == eval_size(flat, True, 64) == (64, 4)
    c = _eval_cfg(problems=64, final_problems=512, final_samples=16)
    assert eval_size(c, False, 512) == (64, 4) and eval_size(c, True, 512) == (512, 16)
    assert eval_size(c, True, 100) == (100, 16)  # capped at the held-out set


def test_the_run_log_names_the_evaluations_sizes():
    """A run's first log line says what its evaluations cover: the toy's sizes are schema defaults, so a
    run of another task without a preset sees that it evaluates part of its held-out set."""
    from dapo_exp.evaluation import sizes_line

    assert sizes_line(_eval_cfg(), 1319) == "evaluations 64 x 4 of 1319 held-out problems, the final one 256 x 8"
    flat = _eval_cfg(problems=None, final_problems=None, final_samples=None)
    assert sizes_line(flat, 30) == "evaluations 30 x 4 of 30 held-out problems"


def test_endpoint_summary_names_and_values():
    from dapo_exp.evaluation import endpoint_summary

    evals = {0: {"eval/acc_avg": 0.1}, 10: {"eval/acc_avg": 0.4}, 20: {"eval/acc_avg": 0.5},
             30: {"eval/acc_avg": 0.6, "eval/acc_avg_rep1": 0.58, "eval/acc_avg_rep2": 0.61}}
    f = endpoint_summary(_eval_cfg(endpoint="final", final_problems=512, final_samples=16), evals, 30, 512)
    assert f["name"] == "final" and f["value"] == 0.6 and f["steps"] == [30]
    assert f["final_repeats"] == [0.58, 0.61] and "avg@16 over 512 problems" in f["label"]
    m = endpoint_summary(_eval_cfg(endpoint="last_k_mean", endpoint_k=3), evals, 30, 64)
    assert m["name"] == "last_k_mean" and m["steps"] == [10, 20, 30] and abs(m["value"] - 0.5) < 1e-12
    assert "last 3 evaluations" in m["label"]


def test_a_larger_held_out_set_keeps_the_first_problems_and_the_training_set():
    """The precise endpoint grows task.arith_n_eval: intermediate evaluations (its first problems)
    and training stay those of the default set."""
    from omegaconf import OmegaConf

    from dapo_exp.config import Config
    from dapo_exp.tasks.arith import load_arith

    c = OmegaConf.structured(Config).task
    small = load_arith(c)
    c.arith_n_eval = 512
    big = load_arith(c)
    assert [p.prompt for p in big.eval[:len(small.eval)]] == [p.prompt for p in small.eval]
    assert [p.prompt for p in big.train] == [p.prompt for p in small.train] and len(big.eval) == 512


def _endpoint_run(root, name: str, seed: int, accs: dict[int, float], endpoint: str, summary_endpoint: bool,
                  k: int = 2):
    """A finished run directory whose evaluations are ``accs`` (step -> accuracy)."""
    import json

    d = root / name
    d.mkdir(parents=True)
    with open(d / rundir.METRICS, "w") as fh:
        for step, acc in sorted(accs.items()):
            fh.write(json.dumps({"step": step, "eval/acc_avg": acc}) + "\n")
    covered = sorted(s for s in accs if s > 0)[-k:] if endpoint != "final" else [max(accs)]
    summary = {"status": "finished", "label": "grpo", "seed": seed, "switches": {},
               "final": {"step": max(accs), "eval/acc_avg": accs[max(accs)]}}
    if summary_endpoint:
        summary["endpoint"] = {"name": endpoint, "k": k, "value": float(np.mean([accs[s] for s in covered])),
                               "steps": covered}
    summary["config"] = {"seed": seed, "eval": {"k": 4, "problems": 64, "endpoint": endpoint, "endpoint_k": k},
                         "task": {"name": "arith", "arith_n_eval": 64}}
    (d / rundir.SUMMARY).write_text(json.dumps(summary))


@pytest.mark.parametrize("summary_endpoint", [True, False])
def test_tables_report_the_declared_endpoint(tmp_path, summary_endpoint):
    """A sweep declaring eval.endpoint=last_k_mean gets the mean of its last k evaluations in the
    table's accuracy column (from summary.json's endpoint, or from the history of a run without
    one), and the caption's first sentence says so; endpoint=final keeps the last evaluation."""
    from dapo_exp.analysis.runs import ENDPOINT_ACC, load_runs
    from dapo_exp.analysis.table import caption, comparison_table

    for seed, (a, b) in enumerate([(0.5, 0.7), (0.6, 0.4), (0.3, 0.5)]):
        _endpoint_run(tmp_path / "late", f"s{seed}", seed, {0: 0.1, 10: 0.2, 20: a, 30: b}, "last_k_mean",
                      summary_endpoint)
        _endpoint_run(tmp_path / "final", f"s{seed}", seed, {0: 0.1, 10: 0.2, 20: a, 30: b}, "final",
                      summary_endpoint)
    late, final = load_runs(tmp_path / "late"), load_runs(tmp_path / "final")
    assert sorted(late.runs[ENDPOINT_ACC].round(6)) == [0.4, 0.5, 0.6]  # (a + b) / 2 per seed
    assert sorted(final.runs[ENDPOINT_ACC].round(6)) == [0.4, 0.5, 0.7]  # the last evaluation
    t_late, t_final = comparison_table(late), comparison_table(final)
    assert t_late.loc["grpo", "final_acc"] == pytest.approx(50.0)
    assert t_final.loc["grpo", "final_acc"] == pytest.approx(100 * (0.7 + 0.4 + 0.5) / 3)
    assert caption(t_late).startswith("Endpoint: mean held-out accuracy of the last 2 evaluations")
    assert caption(t_final).startswith("Endpoint: final held-out accuracy, the last evaluation")


@pytest.mark.parametrize("summary_endpoint", [True, False])
def test_the_column_names_how_many_evaluations_a_short_run_averages(tmp_path, summary_endpoint):
    """Runs declaring the mean of the last 3 evaluations that have only 2 trained evaluations (a shorter
    train.steps) average those 2: the column says last-2, not last-3."""
    from dapo_exp.analysis.runs import ENDPOINT_EVALS, load_runs
    from dapo_exp.analysis.table import caption, comparison_table

    for seed in range(2):
        _endpoint_run(tmp_path / "short", f"s{seed}", seed, {0: 0.1, 10: 0.2 + seed / 10, 20: 0.6}, "last_k_mean",
                      summary_endpoint, k=3)
        _endpoint_run(tmp_path / "long", f"s{seed}", seed, {0: 0.1, 10: 0.2, 20: 0.6, 30: 0.7}, "last_k_mean",
                      summary_endpoint, k=3)
    short, long_ = load_runs(tmp_path / "short"), load_runs(tmp_path / "long")
    assert list(short.runs[ENDPOINT_EVALS]) == [2, 2] and list(long_.runs[ENDPOINT_EVALS]) == [3, 3]
    assert comparison_table(short).attrs["acc_name"] == "acc last-2 mean"
    assert caption(comparison_table(short)).startswith("Endpoint: mean held-out accuracy of the last 2 evaluations")
    assert comparison_table(long_).attrs["acc_name"] == "acc last-3 mean"
    _endpoint_run(tmp_path / "once", "s0", 0, {0: 0.1, 30: 0.6}, "last_k_mean", summary_endpoint, k=3)
    once = comparison_table(load_runs(tmp_path / "once"))  # eval.every=0: the last evaluation alone
    assert once.attrs["acc_name"] == "final acc" and caption(once).startswith("Endpoint: final held-out accuracy")
