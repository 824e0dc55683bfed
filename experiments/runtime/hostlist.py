"""Slurm hostlist expansion (``fd-n[1-2,5]`` -> ``fd-n1 fd-n2 fd-n5``) without calling ``scontrol``.

A pure function, because ranks must not depend on Slurm binaries being on PATH inside the step,
and because it must be cheap and testable without a cluster.
"""

from __future__ import annotations

import itertools


class HostlistError(ValueError):
    """A hostlist expression that Slurm would not accept either."""


def expand_hostlist(expression: str) -> list[str]:
    """Expand a Slurm hostlist into host names, in Slurm's order (duplicates kept)."""
    hosts: list[str] = []
    for item in _split_top_level(expression.strip()):
        hosts.extend(_expand_item(item, expression))
    return hosts


def _split_top_level(expression: str) -> list[str]:
    """Split on commas that are outside brackets (commas inside brackets separate ranges)."""
    items: list[str] = []
    depth = 0
    current: list[str] = []
    for char in expression:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in hostlist {expression!r}")
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise HostlistError(f"unbalanced '[' in hostlist {expression!r}")
    items.append("".join(current))
    return [item.strip() for item in items if item.strip()]


def _expand_item(item: str, expression: str) -> list[str]:
    """One host pattern, possibly with several bracket groups (``r[1-2]n[01-02]``): their product."""
    parts: list[list[str]] = []
    rest = item
    while "[" in rest:
        prefix, _, tail = rest.partition("[")
        body, closed, rest = tail.partition("]")
        if not closed or "[" in body:
            raise HostlistError(f"nested or unclosed bracket in {item!r} of hostlist {expression!r}")
        parts.append([prefix])
        parts.append(_expand_ranges(body, expression))
    parts.append([rest])
    return ["".join(combo) for combo in itertools.product(*parts)]


def _expand_ranges(body: str, expression: str) -> list[str]:
    """``01-03,7`` -> ``01 02 03 7``: the width of the lower bound sets zero padding, as in Slurm."""
    values: list[str] = []
    for chunk in body.split(","):
        chunk = chunk.strip()
        low, dash, high = chunk.partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise HostlistError(f"bad range {chunk!r} in hostlist {expression!r}")
        if not dash:
            values.append(low)
            continue
        start, stop = int(low), int(high)
        if stop < start:
            raise HostlistError(f"descending range {chunk!r} in hostlist {expression!r}")
        width = len(low)
        values.extend(str(number).zfill(width) for number in range(start, stop + 1))
    return values
