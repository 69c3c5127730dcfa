"""The fixes: one module each, registered in :mod:`dapo_exp.fixes.base` (see there for the hook slots).

Importing this package registers the built-in fixes: DAPO's five in the order of Table 1's
columns, then the GRPO family after DAPO, then any other module of this package, by name (a new
fix module needs no line here; list it below only to give it another column). GRPO's own pieces
(:mod:`dapo_exp.fixes.grpo`) are no switch; :mod:`dapo_exp.fixes.verl_rules` holds what the fixes' verl
rules are built from.
Then the fixes from outside the package (:func:`load_outside_fixes`: the ``dapo_exp.fixes`` entry points
of installed distributions, the modules and files named in ``DAPO_EXP_FIXES``), before
:mod:`dapo_exp.config` assembles the ``algo`` schema from all of them. A fix of your own is one module
that calls :func:`register_fix` with its config group as code (``configs``) or as YAML files on a Hydra
search path (docs: how-to/extend.md).
"""

# The imports below register the fixes: their order is the registry's column order, so the import
# sorter leaves this file alone (pyproject.toml, [tool.ruff.lint.per-file-ignores]).
from dapo_exp.fixes.base import *  # noqa: F401,F403 - the registry's public names
from dapo_exp.fixes.base import __all__  # noqa: F401
from dapo_exp.fixes import (  # noqa: E402,F401 - registration order = column order
    clip_higher, dynamic_sampling, token_level_loss, overlong_punishment, overlong_filtering,
)
from dapo_exp.fixes import (  # noqa: E402,F401 - the GRPO family after DAPO
    dr_grpo_adv, dr_grpo_norm, gspo, cispo, gmpo, clip_cov, kl_cov, top_entropy, rollout_correction,
)
from dapo_exp.fixes import (  # noqa: E402,F401 - verl's advantage estimators (the estimator slot)
    rloo, reinforce_pp, opo, grpo_passk, gdpo, remax, gae, optimal_token_baseline,
)

import importlib as _importlib  # noqa: E402
import pkgutil as _pkgutil  # noqa: E402

for _m in sorted(m.name for m in _pkgutil.iter_modules(__path__)):  # noqa: F405 - its other fix modules, by name
    if _m not in ("base", "grpo", "verl_rules"):
        _importlib.import_module(f"{__name__}.{_m}")

load_outside_fixes()  # noqa: F405 - after the package's own: their columns come last
