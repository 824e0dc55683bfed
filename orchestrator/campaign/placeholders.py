"""``{name}`` placeholders in a command workload's argv, env and resume_args.

A name is a key of the spec's ``args`` (sweepable as ``args.<key>``) or one of BUILTINS, filled in
per run before anything is submitted; ``{{`` and ``}}`` are literal braces. An unknown name, a
format spec or a malformed brace is a spec error that names the text and the valid names.
"""

from __future__ import annotations

import string
from typing import Any, Iterable, Mapping

from experiments.layout import ATTEMPT_MARK

__all__ = ["ATTEMPT_MARK", "BUILTINS", "fill", "names_in", "problems"]

# Filled in per run by the orchestrator (orchestrator/campaign/runs.py); ``attempt`` by the rank, when
# the attempt starts (experiments/runtime/command.py), from the mark the orchestrator leaves for it.
BUILTINS = ("run_id", "run_dir", "checkpoint_dir", "attempt", "steps", "seed", "python", "checkpoint_every")

_FORMATTER = string.Formatter()


class PlaceholderError(ValueError):
    pass


def names_in(text: str) -> list[str]:
    """The placeholder names of ``text`` in order; PlaceholderError if it is not well formed."""
    try:
        parts = list(_FORMATTER.parse(text))
    except ValueError as error:
        raise PlaceholderError(f"{text!r}: {error} (write {{{{ and }}}} for literal braces)") from None
    names = []
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if not name or spec or conversion:
            raise PlaceholderError(f"{text!r}: a placeholder is {{name}}, with no format or conversion")
        names.append(name)
    return names


def problems(texts: Iterable[tuple[str, str]], known: Iterable[str]) -> list[str]:
    """One line per bad text of (where, text): unknown names say what is valid."""
    valid = sorted(set(known))
    found = []
    for where, text in texts:
        try:
            unknown = [name for name in names_in(text) if name not in valid]
        except PlaceholderError as error:
            found.append(f"{where}: {error}")
            continue
        for name in unknown:
            found.append(f"{where}: unknown placeholder {{{name}}} in {text!r}; valid: {', '.join(valid)} "
                         "(args keys and the built-ins)")
    return found


def fill(text: str, values: Mapping[str, Any]) -> str:
    return _FORMATTER.vformat(text, (), {name: _plain(value) for name, value in values.items()})


def _plain(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
