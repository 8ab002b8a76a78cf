"""The doctor's report: as text for a person, as JSON for a script; failed() decides the exit code."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict

from worker.doctor.check import Check, Status

MARKS: dict[Status, str] = {"ok": "✓", "warn": "!", "fail": "✗", "skip": "-"}


def failed(checks: Sequence[Check]) -> bool:
    return any(check.status == "fail" for check in checks)


def as_json_report(checks: Sequence[Check]) -> str:
    return json.dumps({"ok": not failed(checks), "checks": [asdict(check) for check in checks]}, indent=2)


def as_text(checks: Sequence[Check]) -> str:
    lines: list[str] = []
    area = None
    for check in checks:
        if check.area != area:
            area = check.area
            lines.append(area)
        lines.append(f"  {MARKS[check.status]} {check.name}: {check.detail}")
        if check.fix and check.status in ("fail", "warn"):
            lines.append(f"      fix: {check.fix}")
    failures = sum(check.status == "fail" for check in checks)
    lines.append(
        f"{failures} problem{'s' if failures != 1 else ''} found." if failures else "All checks passed."
    )
    return "\n".join(lines)
