"""One finding of ``faultdrill doctor``: what was checked, pass / warn / fail, what was found and,
where it is not a pass, what to do."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class Status(StrEnum):
    PASS = "pass"
    WARN = "warn"  # the drill runs, knowing or doing less (the detail says what)
    FAIL = "fail"  # a drill here would fail, or be wrong


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "status": self.status.value}


def passed(name: str, detail: str) -> Check:
    return Check(name, Status.PASS, detail)


def warned(name: str, detail: str, fix: str) -> Check:
    return Check(name, Status.WARN, detail, fix)


def failed(name: str, detail: str, fix: str) -> Check:
    return Check(name, Status.FAIL, detail, fix)
