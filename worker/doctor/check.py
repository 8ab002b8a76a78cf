"""One line of the doctor's report, as every side's checks make it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["ok", "warn", "fail", "skip"]
# Each request of a check waits this long: the doctor is run by hand, and a side that
# does not answer within it is reported as not answering rather than waited for.
TIMEOUT = 15.0


@dataclass
class Check:
    """One line of the report: `fix` says what to change, naming the setting."""

    area: str
    name: str
    status: Status
    detail: str
    fix: str = ""
