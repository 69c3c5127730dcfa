"""verl's advantage estimators as switches (dapo_exp.fixes.<name>) against verl 0.9.1's own registered functions.

Run with verl's interpreter: `.venv-verl/bin/python -m pytest -q -m verl tests/test_verl_parity_estimators.py`
(in the main environment, where verl is not installed, every test here skips saying so).

Seeded random batches (1 to 5 groups of 2 to 16 responses, lengths 1 to T tokens, rewards binary +-1 or
Gaussian, some groups all equal) go through our estimator hook (rewards (N, G), lengths (N, G), parts) and
through verl's function (``core_algos.get_adv_estimator_fn(name)``) with the reward at each response's last
token, as verl's reward manager puts it, and verl's ``AlgoConfig``. verl's per-token advantages must equal ours
broadcast over each response's tokens, in float64. Each comparison has a mutation test: a perturbed copy of ours
(the ``G - 1`` of the leave-one-out, the Bessel correction or the token weights of the whitening, the length
weights of OPO's baseline, the std of Pass@k, GDPO's decoupling, ReMax's greedy baseline) must fail it. Where we
differ from verl (groups of one response, GDPO's float32 inside verl) the difference is asserted, not skipped. GAE
and the optimal token baseline are refused by their switches: what verl's functions need that the trainer lacks is
asserted.

Imports only torch / numpy / pytest and the estimator modules (.venv-verl lacks our other dependencies).
"""

from __future__ import annotations

import functools
import inspect
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

verl = pytest.importorskip("verl", reason="verl is not installed here: run these tests with "
                           ".venv-verl/bin/python (bash .ci/install-verl creates it)")

from verl.trainer.config.algorithm import AlgoConfig  # noqa: E402
from verl.trainer.ppo import core_algos  # noqa: E402

from dapo_exp.fixes import gdpo, grpo_passk, opo, reinforce_pp, remax, rloo  # noqa: E402

pytestmark = pytest.mark.verl

D = torch.float64
T = 12  # padded response width
N_CASES = 40


def cases(n: int = N_CASES, seed: int = 2024, sizes=(2, 4, 8, 16, 3)):
    """Seeded batches: dict(rewards (N, G), lengths (N, G), scores (B, T) with the reward at the last token,
    mask (B, T), index (B,) uids)."""
    gen = torch.Generator().manual_seed(seed)
    for k in range(n):
        N, G = int(torch.randint(1, 6, (1,), generator=gen)), sizes[k % len(sizes)]
        if k % 2:
            rewards = torch.randint(0, 2, (N, G), generator=gen).to(D) * 2 - 1
        else:
            rewards = torch.randn(N, G, generator=gen, dtype=D) * (1 + k % 3)
        if k % 3 == 0:
            rewards[0] = 0.75  # an all-equal group
        lengths = torch.randint(1, T + 1, (N, G), generator=gen)
        yield dict(k=k, **as_verl(rewards, lengths))


def as_verl(rewards, lengths):
    N, G = rewards.shape
    B = N * G
    flat = lengths.reshape(-1)
    mask = (torch.arange(T)[None, :] < flat[:, None]).to(D)
    scores = torch.zeros(B, T, dtype=D)
    scores[torch.arange(B), flat - 1] = rewards.reshape(-1)
    index = np.array([f"p{i // G}" for i in range(B)], dtype=object)
    return dict(rewards=rewards, lengths=lengths.to(D), scores=scores, mask=mask, index=index)


def verl_adv(name, c, **kw):
    adv, _ = core_algos.get_adv_estimator_fn(name)(token_level_rewards=c["scores"], response_mask=c["mask"],
                                                   index=c["index"], **kw)
    return adv


def ours_tokens(hook, c, **kw):
    """Our estimator's (N, G) advantages broadcast over each response's tokens, as verl returns them."""
    adv = hook(c["rewards"], lengths=c["lengths"], parts=kw.pop("parts", {"accuracy": c["rewards"]}), **kw).value
    return adv.reshape(-1, 1) * c["mask"]


def same(a, b, rtol=1e-10, atol=1e-12):
    return torch.allclose(a.to(D), b.to(D), rtol=rtol, atol=atol)


def compare(name, hook, mutant, verl_kw=None, our_kw=None, rtol=1e-10, atol=1e-12):
    """Every case equal; the mutant differs in some. Returns (compared, mutant seen)."""
    seen = 0
    for c in cases():
        v = verl_adv(name, c, **(verl_kw or {}))
        ours = ours_tokens(hook, c, **(our_kw or {}))
        torch.testing.assert_close(ours, v.to(D), rtol=rtol, atol=atol, msg=lambda m, k=c["k"]: f"case {k}: {m}")
        seen += not same(ours_tokens(mutant, c, **(our_kw or {})), v, rtol, atol)
    assert seen >= N_CASES // 4, f"the mutant was seen in {seen} of {N_CASES} cases"


# --------------------------------------------------------------------------- #
# RLOO: rloo and rloo_vectorized                                                #
# --------------------------------------------------------------------------- #
def _rloo_over_g(rewards, *, lengths, parts):  # mutation: / G instead of / (G - 1)
    g = rewards.shape[1]
    return rloo.Out((rewards * g - rewards.sum(1, keepdim=True)) / g, {})


@pytest.mark.parametrize("name", ["rloo", "rloo_vectorized"])
def test_rloo_is_verls(name):
    compare(name, rloo.leave_one_out, _rloo_over_g, verl_kw={"config": AlgoConfig()})


def test_rloo_documented_group_of_one():
    """verl's rloo passes a lone response's reward through, its rloo_vectorized gives 0: the switch refuses
    rollout.n < 2 (its check), so neither is reached."""
    c = as_verl(torch.tensor([[0.5]], dtype=D), torch.tensor([[3]]))
    assert verl_adv("rloo", c, config=AlgoConfig())[0, 0] == 0.5
    assert verl_adv("rloo_vectorized", c, config=AlgoConfig())[0, 0] == 0.0
    from omegaconf import OmegaConf

    from dapo_exp.errors import ConfigError
    from dapo_exp.fixes.base import RunInfo

    with pytest.raises(ConfigError, match="rollout.n >= 2"):
        rloo.FIX.check(OmegaConf.create({"rloo": True}), RunInfo(max_response_len=T, group_size=1, seed=0))


# --------------------------------------------------------------------------- #
# REINFORCE++ and REINFORCE++-baseline: the batch's token-weighted whitening    #
# --------------------------------------------------------------------------- #
def _whiten_mutant(kind):
    def whiten(values, lengths):
        w = torch.ones_like(values) if kind == "per_response" else lengths.to(values.dtype)
        n = w.sum()
        mean = (w * values).sum() / n
        var = (w * (values - mean) ** 2).sum() / n * (1 if kind == "biased" else n / (n - 1))
        return (values - mean) * torch.rsqrt(var + 1e-8), var.sqrt()
    return whiten


@pytest.mark.parametrize("baseline", [False, True])
@pytest.mark.parametrize("kind", ["biased", "per_response"])
def test_reinforce_pp_is_verls(monkeypatch, baseline, kind):
    name = "reinforce_plus_plus_baseline" if baseline else "reinforce_plus_plus"
    hook = functools.partial(reinforce_pp.reinforce_pp, baseline=baseline)
    seen = 0
    for c in cases():
        v = verl_adv(name, c, config=AlgoConfig(gamma=1.0))
        torch.testing.assert_close(ours_tokens(hook, c), v, rtol=1e-9, atol=1e-11)
        with monkeypatch.context() as m:  # mutation: no Bessel correction, or each response weighted once
            m.setattr(reinforce_pp, "length_whiten", _whiten_mutant(kind))
            seen += not same(ours_tokens(hook, c), v, 1e-9, 1e-11)
    assert seen >= N_CASES // 2


def test_reinforce_pp_documented_gamma():
    """verl's reinforce_plus_plus reads algorithm.gamma; the translation sets 1.0. Another gamma discounts the
    outcome reward towards the first tokens, a per-token advantage the estimator slot does not give."""
    c = next(cases())
    discounted = verl_adv("reinforce_plus_plus", c, config=AlgoConfig(gamma=0.9))
    assert not same(ours_tokens(reinforce_pp.reinforce_pp, c), discounted)
    assert AlgoConfig().gamma == 1.0


# --------------------------------------------------------------------------- #
# OPO                                                                           #
# --------------------------------------------------------------------------- #
def _opo_unweighted(rewards, *, lengths, parts):  # mutation: the plain mean (GRPO's Dr. baseline)
    return opo.Out(rewards - rewards.mean(1, keepdim=True), {})


def test_opo_is_verls():
    compare("opo", opo.length_weighted, _opo_unweighted, verl_kw={"config": AlgoConfig()})
    c = as_verl(torch.tensor([[0.5]], dtype=D), torch.tensor([[3]]))  # a group of one: both keep the reward
    assert verl_adv("opo", c, config=AlgoConfig())[0, 0] == 0.5 == ours_tokens(opo.length_weighted, c)[0, 0]


# --------------------------------------------------------------------------- #
# Pass@k                                                                        #
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("norm_std", [True, False])
def test_grpo_passk_is_verls(norm_std):
    hook = functools.partial(grpo_passk.best_margin, norm_std=norm_std, eps=1e-6)
    # mutation: the other std setting (where the std is not 1), or every response of the group getting the margin
    mutant = (functools.partial(grpo_passk.best_margin, norm_std=not norm_std, eps=1e-6))
    compare("grpo_passk", hook, mutant,
            verl_kw={"config": AlgoConfig(norm_adv_by_std_in_grpo=norm_std), "epsilon": 1e-6})


def test_grpo_passk_documented_group_of_one():
    c = as_verl(torch.tensor([[0.5]], dtype=D), torch.tensor([[3]]))
    with pytest.raises(ValueError, match="at least 2 samples"):  # verl raises; the switch refuses rollout.n < 2
        verl_adv("grpo_passk", c, config=AlgoConfig())


# --------------------------------------------------------------------------- #
# GDPO: each component group-normalised apart, summed, whitened                 #
# --------------------------------------------------------------------------- #
def gdpo_case(c, k, norm_std=True, parts=None):
    """Two components (accuracy +-1, a penalty in [-1, 0] with many zeros; or ``parts``) and verl's inputs for
    them: the components in the non-tensor batch under algorithm.gdpo_reward_keys, prompts and attention mask."""
    gen = torch.Generator().manual_seed(100 + k)
    acc = torch.randint(0, 2, c["rewards"].shape, generator=gen).to(D) * 2 - 1
    pen = -torch.rand(c["rewards"].shape, generator=gen, dtype=D) * (torch.rand(c["rewards"].shape,
                                                                               generator=gen) < 0.4)
    B, P = acc.numel(), 3
    parts = parts or {"accuracy": acc, "overlong_punishment": pen}
    cfg = AlgoConfig(gdpo_reward_keys=list(parts), norm_adv_by_std_in_grpo=norm_std)
    attn = torch.cat([torch.ones(B, P), c["mask"].float()], dim=1).long()
    non_tensor = {"uid": c["index"], **{k: v.reshape(-1).numpy() for k, v in parts.items()}}
    kw = dict(config=cfg, non_tensor_batch=non_tensor, batch={"prompts": torch.zeros(B, P), "attention_mask": attn})
    return parts, kw


def _gdpo_summed_first(rewards, *, lengths, parts, norm_std=True, eps=1e-6):  # mutation: GRPO of the sum, whitened
    return gdpo.decoupled(rewards, lengths=lengths, parts={"sum": sum(parts.values())}, norm_std=norm_std, eps=eps)


@pytest.mark.parametrize("norm_std", [True, False])
def test_gdpo_is_verls_at_float32(norm_std):
    """Documented: verl casts the components to float32 (np.asarray(comp, dtype=np.float32)) and computes the
    whole estimator in float32, so the comparison is at float32's tolerance; ours is float32 in the group step
    too (objective.group_advantages)."""
    seen = 0
    for c in cases(sizes=(2, 4, 8, 16)):
        parts, kw = gdpo_case(c, c["k"], norm_std)
        v = core_algos.compute_gdpo_outcome_advantage(c["scores"], c["mask"], c["index"],
                                                      norm_adv_by_std_in_grpo=norm_std, **kw)[0]
        rewards = sum(parts.values())
        hook = functools.partial(gdpo.decoupled, norm_std=norm_std, eps=1e-6)
        ours = hook(rewards, lengths=c["lengths"], parts=parts).value.reshape(-1, 1) * c["mask"]
        torch.testing.assert_close(ours.float(), v.float(), rtol=2e-5, atol=2e-5)
        summed = _gdpo_summed_first(rewards, lengths=c["lengths"], parts=parts, norm_std=norm_std).value
        if norm_std:  # mutation: GRPO's advantage of the summed reward, whitened, is not GDPO's
            seen += not torch.allclose((summed.reshape(-1, 1) * c["mask"]).float(), v.float(), rtol=2e-5, atol=2e-5)
        else:  # documented: without the std division the group step is linear, so decoupling changes nothing
            torch.testing.assert_close(summed, hook(rewards, lengths=c["lengths"], parts=parts).value,
                                       rtol=1e-5, atol=1e-6)
            # mutation: the sum of the components' advantages without the batch's whitening
            plain = sum(gdpo_group(p) for p in parts.values())
            seen += not torch.allclose((plain.reshape(-1, 1) * c["mask"]).float(), v.float(), rtol=2e-5, atol=2e-5)
    assert seen >= N_CASES // 4


def gdpo_group(x):
    from dapo_exp import objective

    return objective.group_advantages(x, norm_std=False).to(D)


def test_gdpo_documented_group_of_one():
    """A lone response: verl's GRPO step passes its reward through (mean 0, std 1), ours gives 0 (GRPO's own
    estimator does the same, tests/test_verl_parity.py); with only lone responses verl whitens the rewards and
    ours is 0."""
    c = as_verl(torch.tensor([[1.0], [-1.0], [1.0]], dtype=D), torch.tensor([[2], [3], [1]]))
    parts, kw = gdpo_case(c, 0, parts={"accuracy": c["rewards"]})
    v = core_algos.compute_gdpo_outcome_advantage(c["scores"], c["mask"], c["index"], **kw)[0]
    ours = gdpo.decoupled(c["rewards"], lengths=c["lengths"], parts=parts).value
    assert (ours == 0).all() and (v[c["mask"].bool()] != 0).all()


# --------------------------------------------------------------------------- #
# ReMax: the reward of each prompt's greedy response as the baseline            #
# --------------------------------------------------------------------------- #
def _remax_group_mean(rewards, *, baseline, lengths, parts):  # mutation: the group's mean instead of the greedy reward
    return remax.Out(rewards - rewards.mean(1, keepdim=True), {})


def test_remax_is_verls():
    """verl reads one baseline per response (its trainer repeats each prompt's greedy reward over the group,
    interleaved, as ``rollout.n`` repeats the prompts); ours one per prompt."""
    gen = torch.Generator().manual_seed(11)
    seen = 0
    for c in cases():
        n, g = c["rewards"].shape
        b = (torch.randint(0, 2, (n,), generator=gen).to(D) * 2 - 1 if c["k"] % 2
             else torch.randn(n, generator=gen, dtype=D))
        v = verl_adv("remax", c, reward_baselines=b.repeat_interleave(g), config=AlgoConfig())
        ours = ours_tokens(remax.greedy_baseline, c, baseline=b)
        torch.testing.assert_close(ours, v.to(D), rtol=1e-10, atol=1e-12, msg=lambda m, k=c["k"]: f"case {k}: {m}")
        seen += not same(ours_tokens(_remax_group_mean, c, baseline=b), v)
    assert seen >= N_CASES // 4, f"the mutant was seen in {seen} of {N_CASES} cases"


# --------------------------------------------------------------------------- #
# Refused: what verl's functions read that the trainer lacks                    #
# --------------------------------------------------------------------------- #
@pytest.mark.parametrize("name, switch, needs", [
    ("gae", "gae", {"values"}),
    ("optimal_token_baseline", "optimal_token_baseline", {"sum_pi_squared", "old_log_probs"}),
    # the multi-turn variant needs the same per-token statistics: the same switch refuses both, naming it
    ("tir_optimal_token_baseline", "optimal_token_baseline", {"sum_pi_squared", "old_log_probs"})])
def test_refused_estimators_need_what_the_trainer_lacks(name, switch, needs):
    params = inspect.signature(core_algos.get_adv_estimator_fn(name)).parameters
    assert needs <= set(params)
    from omegaconf import OmegaConf

    from dapo_exp import fixes
    from dapo_exp.errors import ConfigError
    from dapo_exp.fixes.base import RunInfo

    with pytest.raises(ConfigError, match=f"^{switch}: not supported") as refusal:
        fixes.FIXES[switch].check(OmegaConf.create({switch: True}), RunInfo(max_response_len=T, group_size=4, seed=0))
    assert name in str(refusal.value) or name == switch


def test_verls_v1_trainer_gives_its_estimators_no_greedy_baseline_and_no_reward_components():
    """Why ReMax and GDPO are refused on verl, read from verl 0.9.1's own code: the V1 trainer this backend runs
    (trainer.use_v1=true) fetches a fixed list of fields for its advantage (``_compute_advantage``) that holds no
    ``reward_baselines`` and no reward component, and nothing of verl's V1 package names either; only the legacy
    trainer (ray_trainer.py) decodes the greedy baseline and passes GDPO its ``gdpo_reward_keys``."""
    from pathlib import Path

    ppo = Path(core_algos.__file__).parent  # read as text: importing the trainers needs their data loaders
    base = (ppo / "v1" / "trainer_base.py").read_text()
    fetched = base[base.index("    def _compute_advantage("):]
    fetched = fetched[:fetched.index("\n    def ", 10)]
    assert "select_fields" in fetched and "compute_advantage_for_multi_trajectories" in fetched
    v1 = "".join(p.read_text() for p in (ppo / "v1").glob("*.py"))
    for name in ("reward_baselines", "gdpo_reward_keys"):
        assert name not in v1, f"verl's V1 trainer now reads {name}: ReMax/GDPO may run on verl (fixes/remax.py, gdpo.py)"
        assert name in (ppo / "ray_trainer.py").read_text(), f"the legacy trainer no longer reads {name}"


def test_every_registered_estimator_is_a_switch_or_documented():
    """verl's registry: each estimator is a switch here (refused or not), GRPO's own, or another helper's."""
    from dapo_exp import fixes

    mine = {"rloo": "rloo", "rloo_vectorized": "rloo", "reinforce_plus_plus": "reinforce_pp",
            "reinforce_plus_plus_baseline": "reinforce_pp", "opo": "opo", "grpo_passk": "grpo_passk", "gdpo": "gdpo",
            "remax": "remax", "gae": "gae", "optimal_token_baseline": "optimal_token_baseline",
            "tir_optimal_token_baseline": "optimal_token_baseline"}
    elsewhere = {"grpo", "grpo_vectorized", "gpg"}  # GRPO's own (test_verl_parity.py compares both); GPG's gpg_adv
    assert set(core_algos.ADV_ESTIMATOR_REGISTRY) == set(mine) | elsewhere
    assert set(mine.values()) <= set(fixes.FIXES)
