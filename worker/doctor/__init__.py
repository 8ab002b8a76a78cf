"""`slurm-bridge doctor`: can this worker, with these settings, do its job?

It checks what the worker needs from each side, with the worker's own
settings and credentials, and says for each failure what is wrong and which
setting (or grant) fixes it:

- Kubernetes: the API server answers, and the credentials may do what the
  worker does (SelfSubjectAccessReview for every verb of the chart's RBAC; a
  server without that API gets read probes instead).
- Slurm: the token file, slurmrestd, the token being accepted (`ping`, `diag`),
  slurmctld answering, the default partition, the MCS label, reading nodes and
  the operator rights node sync needs (probed on a node that does not exist,
  so nothing changes).
- Temporal: the connection (TLS, API key), the namespace, and the bridge's
  search attributes with their types.

Nothing is created or changed anywhere.

One module per role: the checks of each side (kubernetes.py, slurm.py,
temporal.py), the report's line (check.py) and its rendering (report.py). This
module puts them together and is what the command and the tests import.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import field_validator

from worker.doctor.check import TIMEOUT, Check, Status
from worker.doctor.kubernetes import PERMISSIONS, RBAC_FIX, Permission, kubernetes_checks
from worker.doctor.report import MARKS, as_json_report, as_text, failed
from worker.doctor.slurm import slurm_checks
from worker.doctor.temporal import search_attributes_check, temporal_checks
from worker.settings import WorkerSettings

__all__ = [
    "MARKS",
    "PERMISSIONS",
    "RBAC_FIX",
    "TIMEOUT",
    "Check",
    "Doctor",
    "DoctorSettings",
    "Permission",
    "Status",
    "as_json_report",
    "as_text",
    "diagnose",
    "failed",
    "search_attributes_check",
]


class DoctorSettings(WorkerSettings):
    """The worker's settings; an unreadable token is a failed check here, not a start-up error."""

    @field_validator("slurm_jwt_file")
    @classmethod
    def _readable(cls, value: Path) -> Path:
        return value


class Doctor:
    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings

    async def run(self) -> list[Check]:
        return [*await self.kubernetes(), *await self.slurm(), *await self.temporal()]

    async def kubernetes(self) -> list[Check]:
        return await kubernetes_checks(self.settings)

    async def slurm(self) -> list[Check]:
        return await slurm_checks(self.settings)

    async def temporal(self) -> list[Check]:
        return await temporal_checks(self.settings)


async def diagnose(settings: WorkerSettings) -> list[Check]:
    return await Doctor(settings).run()
