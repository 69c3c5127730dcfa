"""``python -m dapo_exp.analysis``: see :mod:`dapo_exp.analysis.cli`."""

import sys

from dapo_exp.analysis.cli import main

sys.exit(main())
