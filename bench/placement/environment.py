"""What a run stands on: the Slurm bed (used as it is), the `temporal` binary next to this Python,
and the machine, described for the report; and the run's progress lines on stderr."""

import contextlib
import logging
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from testbed.slurm_bed import SLURM_SID, SlurmBedError, SlurmTestBed

log = logging.getLogger("bench")
TEMPORAL_CLI = Path(sys.executable).with_name("temporal")
SLURM_SID_DIR = Path(os.environ.get("SLURM_SID_DIR", "/var/cache/slurm-bridge/slurm-sid"))


def say(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def connect_slurm() -> SlurmTestBed:
    """The running Slurm bed, never restarted: `up` only when it is not running at all.

    (`slurm-sid.sh up` restarts slurmctld when slurm.conf changed; the bed is
    shared with other test runs, so a running one is used as it is.)
    """
    env_file = SLURM_SID_DIR / "env"
    status = subprocess.run([str(SLURM_SID), "status"], capture_output=True, timeout=60, check=False)
    if status.returncode != 0 or not env_file.exists():
        log.info("Slurm is not running; starting it with %s up", SLURM_SID)
        return SlurmTestBed.up()
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    return SlurmTestBed(env["SLURM_REST_URL"], env["SLURM_USER_NAME"], Path(env["SLURM_JWT_FILE"]))


def count_slurm_jobs(bed: SlurmTestBed) -> int | None:
    """Every job slurmctld holds (any user, ended ones kept for MinJobAge), from the cheap state listing."""
    with contextlib.suppress(Exception):
        response = bed.rest("GET", "/jobs/state/")
        if response.status_code == 200:
            return len(response.json().get("jobs") or [])
    return None


def environment(bed: SlurmTestBed) -> dict[str, str]:
    def run(*command: str) -> str:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return "?"
        return (done.stdout or done.stderr).strip().splitlines()[0] if (done.stdout or done.stderr) else "?"

    cpu_model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    try:
        slurm = bed.scontrol("--version").strip()
    except SlurmBedError:
        slurm = "?"
    mem_total = "?"
    with contextlib.suppress(OSError):
        mem_total = Path("/proc/meminfo").read_text().splitlines()[0].split(":", 1)[1].strip()
    commit = run("git", "-C", str(Path(__file__).resolve().parents[2]), "describe", "--always", "--dirty")
    return {
        "machine": f"{os.cpu_count()} vCPU ({cpu_model}), {mem_total} RAM, {platform.system()} "
        f"{platform.release()}",
        "load": "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg()),
        "python": platform.python_version(),
        "temporalio": metadata.version("temporalio"),
        "temporal": run(str(TEMPORAL_CLI), "--version"),
        "slurm": slurm,
        "bridge": commit,
    }
