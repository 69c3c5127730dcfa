"""Known third-party noise, silenced at its source so that a run's terminal shows its own lines.

:func:`quiet` is called by ``run.py`` before anything is imported and by each training job (a
parallel sweep's workers are other processes): transformers' per-run "Loading weights" progress bar
(``HF_HUB_DISABLE_PROGRESS_BARS``, which transformers reads when it is imported, and its switch when it
already is) and the deprecation warnings of APIs that the supported transformers releases still
accept (:data:`DEPRECATIONS`). Nothing else is filtered: a new warning still shows. Imports nothing
of the project.
"""

from __future__ import annotations

import os
import sys
import warnings

# (category, start of the message): deprecations of arguments that every supported transformers
# release accepts; the calls keep the name the oldest supported release knows
DEPRECATIONS = (
    (FutureWarning, r"`past_key_values` is deprecated"),
    (FutureWarning, r"`is_gradient_checkpointing` is deprecated"),
)


def quiet() -> None:
    """Silence :data:`DEPRECATIONS` and transformers' weight-loading bar in this process (and, through the
    environment, in the processes it starts)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    for category, message in DEPRECATIONS:
        warnings.filterwarnings("ignore", message=message, category=category)
    if "transformers" in sys.modules and os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1":
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
