"""Format registry: one module per wire format, each registering a :class:`~cdclake.formats.base.CdcFormat`.

Built-in formats live in this package and are imported on first lookup. Third-party formats register through the
``cdclake.formats`` entry-point group (the entry point names a module that calls :func:`register`).

To add a format: create ``cdclake/formats/<vendor>.py`` that builds a ``CdcFormat`` and calls ``register`` (every
module of this package except ``base`` is imported on first lookup), and add golden cases under
``tests/cases/<format-name>/`` (see AGENTS.md, "Adding a format").
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from importlib.metadata import entry_points

from cdclake.exceptions import ConfigError, UnknownFormatError
from cdclake.formats.base import CdcFormat, decode_batch, decode_batch_with_metadata

__all__ = [
    "CdcFormat",
    "check_options",
    "decode_batch",
    "decode_batch_with_metadata",
    "get_format",
    "list_formats",
    "register",
]

_SHARED_MODULES = frozenset({"base"})
_REGISTRY: dict[str, CdcFormat] = {}
_loaded = False


def register(fmt: CdcFormat) -> CdcFormat:
    """Adds ``fmt`` to the registry under ``fmt.name`` (a later registration of the same name replaces it)."""
    _REGISTRY[fmt.name] = fmt
    return fmt


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        if module not in _SHARED_MODULES and not module.startswith("_"):
            importlib.import_module(f"{__name__}.{module}")
    for entry in entry_points(group="cdclake.formats"):
        entry.load()


def get_format(name: str) -> CdcFormat:
    """The registered format called ``name``; raises :class:`UnknownFormatError` listing the known names."""
    _load_all()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnknownFormatError(name, _REGISTRY) from None


def list_formats() -> list[CdcFormat]:
    """Every registered format, sorted by name."""
    _load_all()
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]


def check_options(format_options: Mapping[str, Mapping[str, str]], key: str | None = None) -> None:
    """Refuses a format that is not registered, an option its format does not read (format name -> options): a
    misspelt option would otherwise be ignored, and its messages decoded without it (times in UTC instead of the
    source's zone, DTS's swapped images taken as they come), and a value the format cannot use (which would
    otherwise stop the first batch). ``key`` names where the options were given (default: the configuration's
    ``format_options.<format>``)."""
    for name, options in format_options.items():
        where = key or f"format_options.{name}"
        try:
            fmt = get_format(name)
        except UnknownFormatError as exc:
            raise ConfigError(where, str(exc), "name formats listed by `cdclake formats`") from None
        unknown = sorted(set(options) - set(fmt.options) - set(fmt.option_aliases))
        if unknown:
            fix = (
                f"remove it, or use one of its options: {', '.join(sorted(fmt.options))} (`cdclake formats` says what "
                "each does)"
                if fmt.options
                else "remove it: the format has no options"
            )
            raise ConfigError(where, f"{name} has no option {', '.join(unknown)}", fix)
        if fmt.validate_options is not None:
            try:
                fmt.validate_options(options)
            except ValueError as exc:
                raise ConfigError(where, str(exc), "correct the value (`cdclake formats` says what it takes)") from None
