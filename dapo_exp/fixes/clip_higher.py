"""Clip-Higher (DAPO §3.1, Eq. 10): the clip range of PPO's surrogate decoupled, ``eps_high > eps_low``.

The ratio of a token with a positive advantage may rise to ``1 + eps_high`` (paper: 0.28)
before it is clipped, against ``1 - eps_low`` (0.2) below, so that rare tokens can grow
(the paper's argument against entropy collapse). Off, the range is symmetric, as GRPO's.
Its behaviour is the range of the surrogates that use PPO's clip: GRPO's own
(:func:`dapo_exp.fixes.grpo.surrogate`, :func:`dapo_exp.objective.clipped_surrogate` bound to
``eps_low`` / ``eps_high``) and Clip-Cov's, so it fills no slot: it is
a value of GRPO's surrogate, and its switch is read from that value. The range's keys, checks and verl rules are
GRPO's (:data:`dapo_exp.fixes.grpo.SCHEMA`, :func:`dapo_exp.fixes.grpo.check`, :data:`dapo_exp.fixes.grpo.VERL`). The surrogates with a range or weight of their own (GSPO,
CISPO, GMPO) and KL-Cov (no clip) exclude it.
"""

from __future__ import annotations

from dapo_exp import rundir
from dapo_exp.fixes.base import Fix, Judged, register_fix

FIX = register_fix(Fix(
    name="clip_higher", short="clip", title="Clip-Higher", paper="DAPO §3.1, Eq. 10",
    sets=("eps_low", "eps_high"), is_on=lambda a: a.eps_high > a.eps_low,
    slots=(), bind=lambda algo, run: {},
    metrics=("actor/pg_clipfrac_higher", "actor/pg_clipfrac_lower"),
    study=Judged("toy_clip", (
        ("avg/diag/style_step", +1, "share of samples opening the rare, much better step strategy with its `Steps:` "
                                    "marker: how fast a ~1% first token with a large positive advantage grows"),
        (f"avg/{rundir.ENTROPY}", +1, "policy entropy (the paper: the symmetric clip collapses it; here the selected "
                                      "step strategy is itself low-entropy)"),
        (f"avg/{rundir.CLIP_HIGH}", -1, "share of tokens clipped at 1 + eps_high"),
        ("avg/diag/marker_mangled", 0, "step solutions opened by another first token (`xteps:`), not in style_step"))),
))
