"""verl's bypass mode: refused, it needs the engine's log-probs as the old policy's.

verl's ``policy_loss.loss_mode=bypass_mode`` skips the trainer's recompute of the old log-probs and takes the
rollout engine's in their place (``old_log_prob = rollout_log_prob``), then runs PPO's clipped loss or, with
``loss_type=reinforce``, REINFORCE with truncated importance weights (verl's ``compute_policy_loss_reinforce``,
reachable only through this mode; without weights it is GPG's loss, ``gpg=enabled``, as
tests/test_verl_parity_losses.py asserts). The trainer here always recomputes the old log-probs and no slot
replaces them (the engine's reach the ``rollout_weight`` slot only, as the trainer/engine ratio that
``rollout_correction`` weighs with). A switch of its own (:func:`dapo_exp.fixes.base.refused`) so that asking for
it fails before any compute, naming why; it would fill the ``surrogate`` slot.
"""

from __future__ import annotations

from dapo_exp.fixes.base import refused, register_fix
from dapo_exp.fixes.verl_rules import only

FIX = register_fix(refused(
    name="bypass_mode", short="bypass", title="bypass mode (verl)", paper="verl 0.9.1 (core_algos.py, bypass_mode)",
    slot="surrogate", only=only, needs="it needs the engine's log-probs as the old policy's",
    why=("bypass mode takes the rollout engine's log-probs as the old policy's, and the trainer always recomputes "
         "them (the engine's reach only the rollout_weight slot: rollout_correction=enabled weighs with their ratio)"),
    doc="verl's bypass mode: old log-probs = the engine's, PPO's clip or REINFORCE on them",
))
