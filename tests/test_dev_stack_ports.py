"""The local stack checks its ports before it starts anything (`hack/dev_stack.py --check-ports`).

A port this test holds with a real listening socket must stop it with one line
naming the port, this process and the variable that moves the port; the Slurm
test bed's own slurmctld and slurmrestd holding theirs must not.
"""

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from testbed.slurm_bed import SlurmTestBed

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slurm


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def listener() -> Iterator[int]:
    """A port held by this test process, as another program's server would hold it."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield int(server.getsockname()[1])


@pytest.fixture
def free_stack_ports(slurm_bed: SlurmTestBed) -> dict[str, str]:
    """The stack's own ports moved to free ones; the Slurm ports stay the running bed's."""
    return {
        "DEV_KUBE_PORT": str(free_port()),
        "DEV_TEMPORAL_PORT": str(free_port()),
        "DEV_TEMPORAL_UI_PORT": str(free_port()),
        "SLURM_REST_PORT": str(urlsplit(slurm_bed.rest_url).port),
    }


def check_ports(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "hack" / "dev_stack.py"), "--check-ports"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_test_beds_own_slurm_daemons_do_not_count(free_stack_ports: dict[str, str]) -> None:
    rest_port = int(free_stack_ports["SLURM_REST_PORT"])
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        with pytest.raises(OSError, match="in use"):
            probe.bind(("127.0.0.1", rest_port))  # slurmrestd holds it...
    done = check_ports(free_stack_ports)  # ...and that is fine
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("setting", ["DEV_TEMPORAL_PORT", "DEV_KUBE_PORT", "DEV_TEMPORAL_UI_PORT"])
def test_a_taken_port_stops_the_stack_with_one_line(
    free_stack_ports: dict[str, str], listener: int, setting: str
) -> None:
    done = check_ports({**free_stack_ports, setting: str(listener)})
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"port {listener} " in lines[0]
    assert f"in use by pid {os.getpid()} (" in lines[0]  # what holds it, found through /proc
    assert "python" in lines[0]
    assert f"set {setting} to a free port" in lines[0]


def test_a_foreign_process_on_a_slurm_port_is_not_mistaken_for_the_bed(
    free_stack_ports: dict[str, str], listener: int
) -> None:
    done = check_ports({**free_stack_ports, "SLURM_CTLD_PORT": str(listener)})
    assert done.returncode == 1
    assert f"port {listener} for slurmctld is already in use by pid {os.getpid()}" in done.stderr
    assert "set SLURM_CTLD_PORT to a free port" in done.stderr


def test_bad_port_settings_are_one_line_too(free_stack_ports: dict[str, str]) -> None:
    same = free_stack_ports["DEV_TEMPORAL_PORT"]
    done = check_ports({**free_stack_ports, "DEV_TEMPORAL_UI_PORT": same})
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"[dev] DEV_TEMPORAL_UI_PORT and DEV_TEMPORAL_PORT are both {same}: give them different ports"
    )
    done = check_ports({**free_stack_ports, "DEV_KUBE_PORT": "http"})
    assert done.stderr.strip() == "[dev] DEV_KUBE_PORT='http' is not a port number (1-65535)"
