"""A named registry: ``name -> function or class``, with an error that lists the choices.

The places where users extend dapo-exp are registries of this kind, each next to
the code it selects from:

===============================================  ===================  ==============================
registry                                         config key           where
===============================================  ===================  ==============================
tasks                                            ``task.name``           :mod:`dapo_exp.tasks`
rollout engines                                  ``rollout.engine``      :mod:`dapo_exp.rollout`
===============================================  ===================  ==============================

The fixes themselves (reward terms, advantage estimators and transforms, group filters, token masks,
surrogates, normalisers, ...) are registered in :mod:`dapo_exp.fixes`, one module each, and selected by their
config groups (``rloo=enabled``), not by a name in a registry.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Registry(dict, Generic[T]):
    """A ``dict`` of named entries that knows what it holds and which config key picks from it."""

    def __init__(self, what: str, key: str | None = None) -> None:
        super().__init__()
        self.what, self.key = what, key

    def register(self, name: str, entry: T | None = None) -> Any:
        """``reg.register("name", fn)``, or ``@reg.register("name")`` as a decorator."""
        def add(obj: T) -> T:
            if name in self:
                raise ValueError(f"{self.what} {name!r} is already registered")
            self[name] = obj
            return obj

        return add if entry is None else add(entry)

    def pick(self, name: str) -> T:
        """The entry called ``name``; :class:`~dapo_exp.config.ConfigError` listing the choices if none is."""
        if name not in self:
            from dapo_exp.config import ConfigError  # here, so that importing a registry stays light

            where = f"{self.key}={name!r}" if self.key else f"{self.what} {name!r}"
            raise ConfigError(f"{where} is not valid; choose one of: {', '.join(sorted(self))}")
        return self[name]

