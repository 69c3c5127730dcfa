"""DPPO-Binary-KL (Qi et al. 2026, arXiv 2602.04879): DPPO's trust region with the binary KL divergence.

As DPPO-Binary-TV (:mod:`dapo_exp.fixes.dppo_tv`, whose truncated policy gradient it shares) with another
divergence: the KL between the two-outcome distributions (the sampled token, or any other) of the old and
the current policy, ``D = p_old log(p_old / p) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8))``. A
token's update is dropped where ``D > dppo_kl_high`` and its probability rose (``A > 0``), or
``D > dppo_kl_low`` and it fell (``A <= 0``). Thresholds 0.05 / 0.05: the authors' script in verl; cap 20:
as DPPO-Binary-TV's. Logs ``dppo/masked_tokens``; excludes Clip-Higher and refuses GRPO's dual clip.
"""

from __future__ import annotations

from typing import Any

from dapo_exp.fixes.dppo_tv import register, truncated_pg


def surrogate(logp: Any, old_logp: Any, advantages: Any, *, mask: Any = None, low: float = 0.05,
              high: float = 0.05, cap: float = 20.0) -> Any:
    """DPPO-Binary-KL's per-token loss (verl ``compute_policy_loss_dppo_kl``): a token is kept where
    ``D <= high or p <= p_old`` (``A > 0``) or ``D <= low or p >= p_old`` (``A <= 0``); see
    :func:`dapo_exp.fixes.dppo_tv.truncated_pg`."""
    import torch

    from dapo_exp.objective import _token_advantages

    adv = _token_advantages(advantages, logp)
    with torch.no_grad():
        p, p_old = torch.exp(logp), torch.exp(old_logp)
        kl = p_old * (old_logp - logp) + (1 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
        valid = torch.where(adv > 0, (kl <= high) | (p <= p_old), (kl <= low) | (p >= p_old))
    return truncated_pg(logp, old_logp, adv, valid, cap)


FIX = register("dppo_kl", "dppokl", "DPPO-Binary-KL", surrogate, "its binary KL", "low where p fell, high where it rose",
               0.05)
