"""A worker pointed at the test bed: its settings (the real Slurm test bed, an API server's
kubeconfig, fast polling) and the environment of a `slurm-bridge worker` process with them.

Used by the end-to-end harness (tests/e2e/harness.py), the kill points (testbed/kill_points.py)
and the placement benchmark's follower (bench/placement/stack.py).
"""

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from testbed.slurm_bed import SlurmTestBed
from worker.settings import WorkerSettings, load_settings


def bed_settings(bed: SlurmTestBed, kubeconfig: Path, task_queue: str, **overrides: Any) -> WorkerSettings:
    """Worker settings pointing at the real Slurm test bed and a fake API server, polling fast."""
    defaults: dict[str, Any] = {
        "temporal_task_queue": task_queue,
        "slurm_rest_url": bed.rest_url,
        "slurm_user_name": bed.user_name,
        "slurm_jwt_file": bed.jwt_file,
        "kubeconfig": str(kubeconfig),
        "job_watch_interval": 0.2,
        "metrics_port": 0,
    }
    return load_settings(**{**defaults, **overrides})


def settings_env(s: WorkerSettings, temporal_address: str, **extra: str) -> dict[str, str]:
    """The environment of a `slurm-bridge worker` process with these test-bed settings."""
    return {
        **os.environ,
        "TEMPORAL_ADDRESS": temporal_address,
        "TEMPORAL_TASK_QUEUE": s.temporal_task_queue,
        "SLURM_REST_URL": s.slurm_rest_url,
        "SLURM_USER_NAME": s.slurm_user_name or "",
        "SLURM_JWT_FILE": str(s.slurm_jwt_file),
        "SLURM_API_VERSION": s.slurm_api_version,
        "KUBECONFIG": s.kubeconfig or "",
        "SLURM_PARTITION": s.partition,
        "SCHEDULER_NAME": s.scheduler_name,
        "JOB_WATCH_INTERVAL": str(s.job_watch_interval),
        "HEALTH_PORT": "0",
        **extra,
    }


async def stop_process(process: asyncio.subprocess.Process, grace: float = 20.0) -> None:
    """SIGINT (a worker's own shutdown), then SIGKILL after `grace` seconds."""
    if process.returncode is not None:
        return
    process.send_signal(signal.SIGINT)
    try:
        await asyncio.wait_for(process.wait(), grace)
    except TimeoutError:
        process.kill()
        await process.wait()
