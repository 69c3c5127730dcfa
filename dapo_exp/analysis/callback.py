"""Placeholder replaced by the analysis module."""
from hydra.experimental.callback import Callback


class AnalysisCallback(Callback):
    pass
