"""Error hierarchy. Every error cdclake raises on purpose derives from :class:`CdclakeError`.

Errors about one message never surface as exceptions: they become dead letters with a reason. The classes below
are for the operator: bad configuration, unusable arguments, a broken environment.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class CdclakeError(Exception):
    """Root of every error cdclake raises on purpose."""

    def __reduce__(self) -> Any:
        # Keeps errors with keyword-only constructors picklable (Spark ships exceptions between processes).
        return type(self).__new__, (type(self), *self.args), self.__dict__


class TerminalError(CdclakeError):
    """Retrying does not help: the input, configuration or environment must change."""


class ConfigError(TerminalError):
    """A configuration value is missing or wrong. The message names the key and the fix."""

    def __init__(self, key: str, problem: str, fix: str) -> None:
        self.key = key
        self.problem = problem
        self.fix = fix
        super().__init__(f"config error at '{key}': {problem}. Fix: {fix}")


class UnknownFormatError(TerminalError):
    """A format name is not registered."""

    def __init__(self, name: str, known: Iterable[str]) -> None:
        self.name = name
        self.known = sorted(known)
        super().__init__(f"unknown format '{name}'; known formats: {', '.join(self.known)}")


class EnvironmentSetupError(TerminalError):
    """Something the runtime needs (jars, Java, a broker) is missing; the message says which command installs it."""


class InputError(TerminalError):
    """Input files or arguments cannot be used as given."""


class SourceUnavailableError(CdclakeError):
    """The message source cannot be read (brokers unreachable, access refused...); the message gives the client's
    own reason. Retrying may help once the cause is gone."""


class ConstraintViolationError(TerminalError):
    """A row failed a CHECK constraint of a lake table at the write, where cdclake could not check it first (see
    :mod:`cdclake.constraints`); the message names the table and the fix."""
