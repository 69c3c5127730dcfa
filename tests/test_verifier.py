"""The verifiers: the paper's math_dapo semantics, math_verify, and robustness to adversarial output."""

from __future__ import annotations

import importlib.util
import threading
import time

import pytest

from dapo_exp.tasks import math_dapo
from dapo_exp.tasks.math_dapo import TAIL_CHARS, normalize_final_answer
from dapo_exp.tasks.verifier import (
    VERIFIERS,
    VerifyResult,
    extract_last_answer,
    get_verifier,
    reward_of,
)

HAS_MATH_VERIFY = importlib.util.find_spec("math_verify") is not None

# --------------------------------------------------------------------------- #
# Normalisation: each rule of verl's normalize_final_answer, worked by hand      #
# --------------------------------------------------------------------------- #
NORMALISATION = [
    ("42", "42"),
    ("  42  ", "42"),
    ("x = 5", "5"),  # text after the last "="
    ("a=b=7", "7"),
    ("1,000", "1000"),  # thousands commas dropped when only digits remain
    ("1,234,567", "1234567"),
    ("1,2", "12"),  # ... which also merges a two-element list of digits (the reference's quirk)
    ("(1,2)", "(1,2)"),  # not all digits: commas stay
    ("$42$", "42"),
    ("The answer is $12$.", "12"),  # first $...$ span of the line
    ("\\boxed{17}", "17"),
    ("$\\boxed{1,000}$ dollars", "1000"),
    ("\\text{(B)}", "(B)"),
    ("\\textbf{7}", "7"),
    ("\\overline{3}", "3"),
    ("\\frac12", "\\frac{1}{2}"),  # shorthand expanded
    ("\\frac{1}{2}", "\\frac{1}{2}"),
    ("\\dfrac{1}{2}", "\\dfrac{1}{2}"),  # \dfrac is NOT rewritten (string match, not math)
    ("\\sqrt2", "\\sqrt{2}"),
    ("90^\\circ", "90"),
    ("90^{\\circ}", "90"),
    ("10 degrees", "10"),
    ("10 cm", "10"),
    ("12 \\text{cm}^2", "12"),
    ("5 \\text{ students}", "5"),
    ("5 dollars", "5"),
    ("\\$5", "5"),
    ("a 5", "5"),  # article "a " dropped
    ("1\\,000", "1\\,000"),  # thin space is not in the list
    ("1{,}000", "1000"),
    ("3.14", "3.14"),
    ("-3", "-3"),
    ("0.5", "0.5"),
]


@pytest.mark.parametrize("raw,expected", NORMALISATION)
def test_normalize_final_answer(raw, expected):
    assert normalize_final_answer(raw) == expected


# --------------------------------------------------------------------------- #
# Extraction and scoring: last "Answer:" in the last 300 characters              #
# --------------------------------------------------------------------------- #
FILLER = "z" * 400
SCORING = [
    # (response, ground truth, correct, pred)
    ("Some reasoning.\nAnswer: 42", "42", True, "42"),
    ("answer: 42", "42", True, "42"),  # case-insensitive
    ("ANSWER :42", "42", True, "42"),
    ("Answer:\n42", "42", True, "42"),  # \s* crosses the newline
    ("Answer: 41\nmore thoughts\nAnswer: 42", "42", True, "42"),  # the last one counts
    ("Answer: 42\nwait, no.\nAnswer: 41", "42", False, "41"),
    ("Answer: 3. Answer: 4", "4", False, "3.Answer:4"),  # one match per line, up to its end
    ("Answer: \\boxed{42}", "42", True, "42"),
    ("Answer: $42$", "42", True, "42"),
    ("Answer: 1,000", "1000", True, "1000"),
    ("Answer: 10 degrees", "10", True, "10"),
    ("Answer: x = 42", "42", True, "42"),
    ("Answer: \\frac12", "\\frac{1}{2}", True, "\\frac{1}{2}"),
    ("Answer: 0.5", "\\frac{1}{2}", False, "0.5"),  # exact match, not equivalence
    ("Answer: 41", "42", False, "41"),
    ("The answer is 42.", "42", False, None),  # no "Answer:" line
    ("\\boxed{42}", "42", False, None),  # a box alone is not an answer under this rule
    ("Answer: ", "42", False, None),  # blank
    ("", "42", False, None),
    ("Answer: 42\n" + FILLER, "42", False, None),  # outside the 300-character tail
    (FILLER * 5 + "Answer: 42", "42", True, "42"),  # long response, answer at the end
    ("Answer: 540", "540", True, "540"),
]


@pytest.mark.parametrize("response,truth,correct,pred", SCORING)
def test_math_dapo_scoring(response, truth, correct, pred):
    v = get_verifier("math_dapo")
    res = v.verify(response, truth)
    assert (res.correct, res.pred, res.timed_out) == (correct, pred, False)
    assert reward_of(res) == (1.0 if correct else -1.0)
    assert v._pool is None  # decided in-process, no worker started


def test_tail_boundary_is_300_characters():
    assert TAIL_CHARS == 300
    inside = "Answer: 7" + "y" * (300 - len("Answer: 7"))  # exactly 300 characters
    cut = "Answer: 7 " + "y" * 295  # 305: the tail starts inside "Answer"
    assert math_dapo.score(inside, "7") == (False, "7" + "y" * 291)  # found; the line continues
    assert math_dapo.score("Answer: 7\n" + "y" * 290, "7") == (True, "7")
    assert math_dapo.score(cut, "7") == (False, None)
    assert extract_last_answer(cut, tail_chars=None) == "7 " + "y" * 295
    assert extract_last_answer(cut) is None


def test_batch_matches_single_and_reward():
    v = get_verifier("math_dapo")
    responses = [r for r, *_ in SCORING]
    truths = [t for _, t, *_ in SCORING]
    batch = v.verify_batch(responses, truths)
    assert batch == [v.verify(r, t) for r, t in zip(responses, truths)]
    assert [reward_of(r) for r in batch] == [1.0 if c else -1.0 for _, _, c, _ in SCORING]


def test_interface_errors_and_names():
    assert set(VERIFIERS) == {"math_dapo", "answer_or_boxed", "math_verify"}
    with pytest.raises(ValueError, match="answer_or_boxed, math_dapo, math_verify"):
        get_verifier("nope")
    with pytest.raises(ValueError, match="verifier_timeout_s"):
        get_verifier("math_dapo", timeout_s=0)
    with pytest.raises(ValueError, match="2 responses but 1 answers"):
        get_verifier("math_dapo").verify_batch(["a", "b"], ["1"])
    assert get_verifier("math_dapo").verify_batch([], []) == []


def test_toy_sized_batch_is_fast_and_in_process():
    v = get_verifier("math_dapo")
    responses = [f"{i} + {i} = ?\nAnswer: {2 * i + (i % 3 == 0)}" for i in range(512)]
    truths = [str(2 * i) for i in range(512)]
    res = v.verify_batch(responses, truths)  # ~10 ms in practice: in-process, no worker started (not timed)
    assert sum(r.correct for r in res) == sum(i % 3 != 0 for i in range(512))
    assert v._pool is None


# --------------------------------------------------------------------------- #
# Adversarial model output: never raises, never hangs                            #
# --------------------------------------------------------------------------- #
ADVERSARIAL = [
    "9" * 1_000_000,  # a megabyte
    "Answer: " * 200_000,
    "Answer: " + "{" * 100_000 + "}" * 100_000,  # deep nesting
    "Answer: " + "\\boxed{" * 40 + "1" + "}" * 40,
    "Answer: " + "\\frac" * 60,
    "Answer: 10^10^10^10",
    "Answer: 9" * 3 + "^9" * 90,
    "Answer: " + "$" * 290,
    "Answer: " + "(" * 290,
    "Answer: __import__('os').system('echo pwned')",
    "Answer: eval(input())",
    "Answer: \x00\x1b[31m\x07\r\x7f",
    "Answer: \ud800\udfff",  # lone surrogates
    "Answer: 𝟜𝟚 ٤٢ ４２ 🙂 \u202e",  # unicode digits, RTL override
    "Answer: ²",  # str.isdigit() is True for superscripts
    b"Answer: 42\xff\xfe",  # bytes, invalid UTF-8
    None,
    12345,
]


def test_adversarial_math_dapo_in_process(monkeypatch):
    """Bounded by construction, not timed: the in-process scorer only ever sees a response's last TAIL_CHARS
    and a ground truth of at most MAX_INPROCESS_ANSWER_CHARS (longer ones go to a worker with a time-out)."""
    from dapo_exp.tasks.math_dapo import TAIL_CHARS
    from dapo_exp.tasks.verifier import MAX_INPROCESS_ANSWER_CHARS

    v = get_verifier("math_dapo", timeout_s=2.0)
    seen, fast = [], v._fast
    monkeypatch.setattr(v, "_fast", lambda tail, truth: seen.append((len(tail), len(truth))) or fast(tail, truth))
    res = v.verify_batch(ADVERSARIAL, ["42"] * len(ADVERSARIAL))
    assert len(seen) == len(ADVERSARIAL)
    assert max(t for t, _ in seen) <= TAIL_CHARS and max(a for _, a in seen) <= MAX_INPROCESS_ANSWER_CHARS
    assert all(isinstance(r, VerifyResult) and not r.timed_out for r in res)
    assert res[15].correct is False and res[15].pred.startswith("42")  # bytes decoded leniently
    assert v._pool is None


def test_adversarial_ground_truth_goes_to_a_worker():
    # a ground truth longer than MAX_INPROCESS_ANSWER_CHARS is normalised in a worker
    v = get_verifier("math_dapo", timeout_s=3.0, workers=1)
    try:
        res = v.verify_batch(["Answer: 7" * 3, "Answer: x"], ["7" * 2000, "$" + "a" * 5000])  # bounded: timeout_s
        assert [r.correct for r in res] == [False, False] and not any(r.timed_out for r in res)
        assert v._pool is not None
    finally:
        v.close()


def _verify_in_child(queue):
    v = get_verifier("math_dapo", timeout_s=3.0, workers=1)
    queue.put(v.verify("Answer: 5", "5" * 3000))  # long ground truth: worker path
    v.close()


def test_worker_pool_from_a_daemonic_process_and_after_a_crash():
    import multiprocessing as mp
    import os
    import signal

    # multiprocessing refuses children inside daemonic processes; the pool uses subprocess
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_verify_in_child, args=(queue,), daemon=True)
    child.start()
    assert queue.get(timeout=30) == VerifyResult(False, "5")
    child.join(timeout=10)

    # a worker that dies between calls is replaced; the call still gets its answer
    v = get_verifier("math_dapo", timeout_s=3.0, workers=1)
    try:
        assert v.verify("Answer: 7", "7" * 1500).correct is False
        os.kill(v.pool._workers[0].proc.pid, signal.SIGKILL)
        time.sleep(0.1)
        assert v.verify("Answer: " + "7" * 250, "7" * 1500) == VerifyResult(False, "7" * 250)
    finally:
        v.close()


# --------------------------------------------------------------------------- #
# math_verify: symbolic equivalence, in a worker with a hard time limit          #
# --------------------------------------------------------------------------- #
needs_math_verify = pytest.mark.skipif(not HAS_MATH_VERIFY, reason="math-verify is not installed")

EQUIVALENCE = [
    ("Answer: 1/2", "\\frac{1}{2}", True),
    ("Answer: 0.5", "\\frac{1}{2}", True),
    ("Answer: $\\frac{1}{2}$", "0.5", True),
    ("Answer: 2\\sqrt{2}", "\\sqrt{8}", True),
    ("Answer: \\{1,2\\}", "\\{2,1\\}", True),
    ("Answer: 5 dollars", "5", True),
    ("Answer: 204.", "204", True),
    ("Answer: 007", "7", True),  # both plain integers: decided in-process
    ("Answer: 6", "5", False),
    ("Answer: \\pi", "3.14159", False),
    ("The answer is 1/2", "\\frac{1}{2}", False),  # no "Answer:" line: wrong, as under math_dapo
]


@needs_math_verify
def test_math_verify_equivalence_and_time_bound():
    timeout = 1.5
    v = get_verifier("math_verify", timeout_s=timeout, workers=1)
    try:
        res = v.verify_batch([r for r, _, _ in EQUIVALENCE], [t for _, t, _ in EQUIVALENCE])
        assert [r.correct for r in res] == [c for _, _, c in EQUIVALENCE]
        assert not any(r.timed_out for r in res)
        # math_verify accepts everything math_dapo accepts
        strict = get_verifier("math_dapo")
        for response, truth, *_ in SCORING:
            if strict.verify(response, truth).correct:
                assert v.verify(response, truth).correct, response

        # a hanging parse is killed at the limit (its worker killed: the time-out acted, not timed here), also
        # when called from another thread
        hung = v.verify("Answer: 10^{10^{10^{10}}}", "1")  # sympy evaluates the tower: hangs
        assert (hung.correct, hung.timed_out) == (False, True)
        assert v.pool.n_killed == 1

        box = {}
        thread = threading.Thread(target=lambda: box.update(r=v.verify_batch(["Answer: 9^{9^{9^{9^{9}}}}", "Answer: 1/2"],
                                                                             ["1", "0.5"])))
        thread.start()
        thread.join(timeout=60)  # a hang guard (one time-out, one restart, one item: seconds)
        assert not thread.is_alive()
        assert [(r.correct, r.timed_out) for r in box["r"]] == [(False, True), (True, False)]
        assert v.pool.n_killed == 2

        # adversarial content through the worker: no exception, each within the limit
        cheap = [ADVERSARIAL[i] for i in (7, 9, 10, 11, 12, 13)]  # 6 and 8 hang like the ones above
        res = v.verify_batch(cheap, ["1"] * len(cheap))
        assert all(isinstance(r, VerifyResult) and not r.correct for r in res)
    finally:
        v.close()


# --------------------------------------------------------------------------- #
# Hedged answers: only the one final answer counts, under both verifiers          #
# --------------------------------------------------------------------------- #
HEDGES = [
    # (response, ground truth): each names the truth somewhere, none commits to it alone
    ("Answer: 7 or 8", "8"),
    ("Answer: 8, no wait, 7", "7"),
    ("Answer: 7e100", "7"),
    ("Answer: \\frac{1}{2} or 3", "3"),
]
# more hedges math-verify's parser would otherwise resolve to one side
HEDGES_MORE = [
    ("Answer: 8 or 7", "7"),
    ("Answer: 7 \\text{ or } 8", "8"),
    ("Answer: 7 and 8", "7"),
    ("Answer: 8; 7", "7"),
    ("Answer: 7 8", "8"),
    ("Answer: 8 \\approx 7", "8"),
    ("Answer: 7}{8", "7"),
    ("Answer: \\boxed{7} \\boxed{8}", "8"),
    ("Answer: 7 \\pm 1", "8"),
    # relations that keep one side (issue 34): math_dapo keeps verl's rule and scores these on the right side
    ("Answer: 7 \\equiv 8", "8"),
    ("Answer: 7 := 8", "8"),
    ("Answer: 8 =: 7", "7"),
    ("Answer: 7 \\to 8", "8"),
    ("Answer: 7 \\mapsto 8", "8"),
    ("Answer: 7 \\Rightarrow 8", "8"),
    ("Answer: 7 \\sim 8", "8"),
    ("Answer: 7 \\cong 8", "8"),
]


@pytest.mark.parametrize("response,truth", HEDGES)
def test_hedged_answers_are_wrong_under_math_dapo(response, truth):
    res = get_verifier("math_dapo").verify(response, truth)
    assert (res.correct, res.timed_out) == (False, False), res


@needs_math_verify
def test_hedged_answers_are_wrong_under_math_verify():
    v = get_verifier("math_verify", timeout_s=5.0, workers=1)
    try:
        cases = HEDGES + HEDGES_MORE
        res = v.verify_batch([r for r, _ in cases], [t for _, t in cases])
        assert [(r.correct, r.timed_out) for r in res] == [(False, False)] * len(cases), \
            [c for c, r in zip(cases, res) if r.correct]
        # the committed answer alone is still right, and so are its legitimate equivalents
        good = [("Answer: 8", "8"), ("Answer: 1/2", "\\frac{1}{2}"), ("Answer: 0.5", "\\frac{1}{2}"),
                ("Answer: 204.", "204"), ("Answer: x = \\frac{1}{2}", "0.5"), ("Answer: \\{7,8\\}", "\\{8,7\\}")]
        res = v.verify_batch([r for r, _ in good], [t for _, t in good])
        assert [r.correct for r in res] == [True] * len(good)
    finally:
        v.close()


@needs_math_verify
def test_math_verify_scorer_has_no_raw_text_fallback():
    from dapo_exp.tasks.verifier import _score_math_verify

    for response, truth in HEDGES:
        raw = extract_last_answer(response)
        assert _score_math_verify(raw, truth) == (False, None), response
    assert _score_math_verify("1/2", "\\frac{1}{2}") == (True, None)


# --------------------------------------------------------------------------- #
# The relational hedges, one test per form: approximately, similar, congruent,   #
# proportional, identical, defined as, maps to; in LaTeX and in Unicode           #
# --------------------------------------------------------------------------- #
RELATIONAL_HEDGES = [
    "\\approx", "\\approxeq", "\\thickapprox", "\\simeq", "\\sim", "\\thicksim", "\\backsim", "\\backsimeq",
    "\\eqsim", "\\cong", "\\propto", "\\varpropto", "\\equiv", "\\asymp", "\\doteq", "\\fallingdotseq",
    "\\risingdotseq", "\\circeq", "\\triangleq", "\\bumpeq", "\\Bumpeq", "\\coloneqq", "\\eqqcolon", "\\lesssim",
    "\\gtrsim", "\\lessapprox", "\\gtrapprox", "\\to", "\\mapsto", "\\Rightarrow", "\\Longrightarrow",
    "\\implies", "\\iff", ":=", "=:",
    "≈", "≃", "∼", "≅", "∝", "≊", "≋", "≌", "≍", "≎", "≏", "≐", "≑", "≒", "≓", "≔", "≕", "≖", "≗", "≘",
    "≙", "≚", "≛", "≜", "≝", "≞", "≟", "≡", "≣", "∽", "≂", "⋍", "≲", "≳", "∻", "⩰", "⩭", "～", "→", "⇒", "↦",
    "⟶", "⟹",
]


@pytest.mark.parametrize("rel", RELATIONAL_HEDGES)
def test_a_relational_hedge_is_wrong_under_math_verify_on_either_side(rel):
    """``8 <rel> 7`` names the truth on one side and commits to neither; math-verify's parser keeps one
    side of some (``8 \\approxeq 7`` and ``8 ≈ 7`` parse as 8), so the answer is refused before it: by the
    in-process check and by the worker's scorer alike, whichever side holds the truth."""
    from dapo_exp.tasks.verifier import MathVerifyVerifier, _math_verify_pred_text

    assert _math_verify_pred_text(f"8 {rel} 7") is None and _math_verify_pred_text(f"x{rel}8") is None
    fast = MathVerifyVerifier.__new__(MathVerifyVerifier)  # the in-process path alone: no worker started
    for response, truth in ((f"Answer: 8 {rel} 7", "8"), (f"Answer: 7 {rel} 8", "8"), (f"Answer: x {rel} 8", "8")):
        assert fast._fast(response, truth) == VerifyResult(False, None), response
    if HAS_MATH_VERIFY:  # the worker's scorer, called directly, refuses it as well
        from dapo_exp.tasks.verifier import _score_math_verify

        for answer in (f"8 {rel} 7", f"7 {rel} 8", f"x {rel} 8"):
            assert _score_math_verify(answer, "8") == (False, None), answer


@pytest.mark.parametrize("rel", ["\\approxeq", "≈", "≡", "≔"])
def test_math_dapo_keeps_verls_rule_on_the_relational_hedges(rel):
    """The paper's reward is verl's string rule: these answers are compared as the strings its normalisation
    makes of them (none equal to the truth), not refused; the hedge refusal is math_verify's alone."""
    v = get_verifier("math_dapo")
    for answer in (f"8 {rel} 7", f"7 {rel} 8"):
        res = v.verify(f"Answer: {answer}", "8")
        assert (res.correct, res.pred) == (False, normalize_final_answer(answer)), answer
