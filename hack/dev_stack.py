"""The local stack behind `./dev run`: every real part on embedded defaults.

Starts the Temporal dev server (UI on :8233), makes sure real Slurm runs with
two external nodes, serves the simulated Kubernetes API (with a simulated
kubelet), runs `slurm-bridge worker` against them, and places a sample pod.
It then keeps running until Ctrl-C, so you can `kubectl --kubeconfig
.local/kubeconfig` and browse the placement in the Temporal UI.

    python hack/dev_stack.py [--once]   # --once: exit after the sample pod finished (used by the tests)
    python hack/dev_stack.py --check-ports   # only check that the stack's ports are free

It shares the machine politely: before anything starts, every port it will
listen on is checked, and a taken one stops it with one line naming the port,
what holds it (when /proc tells) and the variable that moves it:

    DEV_KUBE_PORT (6443)         the simulated Kubernetes API
    DEV_TEMPORAL_PORT (7233)     Temporal's frontend
    DEV_TEMPORAL_UI_PORT (8233)  the Temporal UI
    SLURM_CTLD_PORT (6817)       slurmctld     } read by hack/slurm-sid.sh too; held by the
    SLURM_REST_PORT (6820)       slurmrestd    } test bed's own daemons, they are not taken
"""

import argparse
import asyncio
import errno
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STATE = REPO / ".local"
NODES = ["dev-node-1", "dev-node-2"]
SCHEDULER = "slurm-bridge-scheduler"
SLURM_SID_DIR = Path(os.environ.get("SLURM_SID_DIR", "/var/cache/slurm-bridge/slurm-sid"))


@dataclass(frozen=True)
class Port:
    number: int
    what: str
    setting: str  # the environment variable that moves it
    slurm_bed: bool = False  # may already be held by the test bed's own daemon


def env_port(setting: str, default: int) -> int:
    value = os.environ.get(setting, "")
    if not value:
        return default
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise SystemExit(f"[dev] {setting}={value!r} is not a port number (1-65535)")
    return int(value)


def stack_ports() -> list[Port]:
    ports = [
        Port(env_port("DEV_KUBE_PORT", 6443), "the simulated Kubernetes API", "DEV_KUBE_PORT"),
        Port(env_port("DEV_TEMPORAL_PORT", 7233), "Temporal", "DEV_TEMPORAL_PORT"),
        Port(env_port("DEV_TEMPORAL_UI_PORT", 8233), "the Temporal UI", "DEV_TEMPORAL_UI_PORT"),
        Port(env_port("SLURM_CTLD_PORT", 6817), "slurmctld", "SLURM_CTLD_PORT", slurm_bed=True),
        Port(env_port("SLURM_REST_PORT", 6820), "slurmrestd", "SLURM_REST_PORT", slurm_bed=True),
    ]
    seen: dict[int, Port] = {}
    for port in ports:
        if port.number in seen:
            raise SystemExit(
                f"[dev] {port.setting} and {seen[port.number].setting} are both {port.number}: "
                "give them different ports"
            )
        seen[port.number] = port
    return ports


def port_taken(number: int) -> bool:
    """Whether a listener on 127.0.0.1:number would fail (the stack listens there)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As the servers themselves do: a connection lingering in TIME_WAIT does not count.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", number))
        except OSError as error:
            if error.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


def port_holders(number: int) -> list[int]:
    """PIDs with a socket bound to the port, from /proc (best effort: others' fds need root)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local address "0100007F:1C8F"; state 0A = LISTEN, 06 = TIME_WAIT (holds nothing)
            if len(fields) > 9 and int(fields[1].rsplit(":", 1)[1], 16) == number and fields[3] != "06":
                inodes.add(f"socket:[{fields[9]}]")
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                pids.append(int(proc.name))
        except OSError:  # gone, or not ours to look at
            continue
    return sorted(pids)


def describe(pid: int) -> str:
    try:
        command = (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        )
    except OSError:
        command = ""
    return f"pid {pid} ({command[:80]})" if command else f"pid {pid}"


def in_slurm_bed(pid: int) -> bool:
    """The test bed's daemons run chrooted into $SLURM_SID_DIR/root (hack/slurm-sid.sh)."""
    try:
        return os.path.realpath(f"/proc/{pid}/root") == os.path.realpath(SLURM_SID_DIR / "root")
    except OSError:
        return False


def slurm_bed_running() -> bool:
    done = subprocess.run([str(REPO / "hack" / "slurm-sid.sh"), "status"], capture_output=True, check=False)
    return done.returncode == 0


def check_ports(ports: list[Port]) -> None:
    """Stop with one line per taken port, naming what holds it and the setting that moves it."""
    problems = []
    for port in ports:
        if not port_taken(port.number):
            continue
        holders = port_holders(port.number)
        if port.slurm_bed and (
            (holders and all(in_slurm_bed(pid) for pid in holders)) or (not holders and slurm_bed_running())
        ):
            continue  # our own slurmctld / slurmrestd from an earlier `slurm-sid.sh up`
        held = (
            f"by {', '.join(describe(pid) for pid in holders)}"
            if holders
            else "(by a process not visible here)"
        )
        problems.append(
            f"[dev] port {port.number} for {port.what} is already in use {held}; "
            f"set {port.setting} to a free port, e.g. {port.setting}={free_port_near(port.number)} ./dev run"
        )
    if problems:
        raise SystemExit("\n".join(problems))


def free_port_near(number: int) -> int:
    for candidate in range(number + 1, min(number + 200, 65535)):
        if not port_taken(candidate):
            return candidate
    return number + 1


def say(message: str) -> None:
    print(f"[dev] {message}", flush=True)


@contextmanager
def process(
    name: str, argv: list[str], env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    log = (STATE / f"{name}.log").open("wb")
    child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    try:
        yield child
    finally:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            child.kill()
        log.close()


async def wait_for_port(port: int, what: str, child: subprocess.Popen[bytes], seconds: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        if child.poll() is not None:
            raise SystemExit(f"{what} exited; see {STATE}/{what}.log")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            if asyncio.get_running_loop().time() > deadline:
                raise SystemExit(f"{what} did not listen on {port}; see {STATE}/{what}.log") from None
            await asyncio.sleep(0.2)


def slurm_env() -> dict[str, str]:
    out = subprocess.run(
        [str(REPO / "hack" / "slurm-sid.sh"), "up", *NODES], check=True, capture_output=True, text=True
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def sample_pod() -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "hello-slurm",
            "namespace": "default",
            "annotations": {
                "slurmjob.slinky.slurm.net/timelimit": "10",
                # The simulated kubelet lets the container "run" this long, then succeed.
                "kube-fake.slurm-bridge.dev/run-seconds": "20",
            },
        },
        "spec": {
            "schedulerName": SCHEDULER,
            "containers": [
                {
                    "name": "hello",
                    "image": "busybox",
                    "resources": {"requests": {"cpu": "1", "memory": "256Mi"}},
                }
            ],
        },
    }


def placement_link(ui_port: int, uid: str) -> str:
    """The sample pod's placement in the Temporal UI (the worker's installation, as it names it)."""
    sys.path.insert(0, str(REPO))
    from urllib.parse import quote

    from bridge import keys
    from bridge.models import PodRef
    from worker.pod_watcher import workflow_id

    installation = os.environ.get("INSTALLATION_ID") or keys.DEFAULT_INSTALLATION
    placement = workflow_id(PodRef(namespace="default", name="hello-slurm", uid=uid), installation)
    return f"http://localhost:{ui_port}/namespaces/default/workflows/{quote(placement, safe='')}"


async def place_sample(kubeconfig: Path, once: bool, ui_port: int) -> None:
    sys.path.insert(0, str(REPO))
    from clients.kube_client import KubeClient, KubeNotFound, api_path, load_configuration

    kube = KubeClient(await load_configuration(str(kubeconfig)))
    try:
        pods = api_path("pods", namespace="default")
        pod = await kube.request("POST", pods, body=sample_pod())
        link = placement_link(ui_port, pod["metadata"]["uid"])
        say(f"created pod default/hello-slurm; its placement: {link}")
        seen = ""
        while True:
            try:
                pod = await kube.request("GET", api_path("pods", namespace="default", name="hello-slurm"))
            except KubeNotFound:
                say("pod finished and is gone")
                return
            meta = pod["metadata"]
            line = (
                f"phase={pod['status'].get('phase')} node={pod['spec'].get('nodeName') or '-'} "
                f"slurm-job={(meta.get('labels') or {}).get('scheduler.slinky.slurm.net/slurm-jobid', '-')} "
                f"finalizers={json.dumps(meta.get('finalizers') or [])}"
            )
            if line != seen:
                say(line)
                seen = line
            if once and pod["status"].get("phase") == "Succeeded" and not meta.get("finalizers"):
                return
            await asyncio.sleep(0.5)
    finally:
        await kube.close()


async def main(once: bool) -> None:
    ports = stack_ports()
    check_ports(ports)
    kube_port, temporal_port, ui_port = (port.number for port in ports[:3])
    STATE.mkdir(exist_ok=True)
    bin_dir = Path(sys.executable).parent
    kubeconfig = STATE / "kubeconfig"
    say("starting Slurm (hack/slurm-sid.sh up)")
    slurm = slurm_env()
    search_attributes = [
        "PodNamespace=Keyword",
        "PodName=Keyword",
        "PodUID=Keyword",
        "PlacementGroup=Keyword",
        "PlacementPhase=Keyword",
        "SlurmJobId=Int",
        "SlurmNodes=KeywordList",
    ]
    with ExitStack() as stack:
        temporal = stack.enter_context(
            process(
                "temporal",
                [
                    str(bin_dir / "temporal"),
                    "server",
                    "start-dev",
                    "--ip",
                    "127.0.0.1",
                    "--port",
                    str(temporal_port),
                    "--ui-port",
                    str(ui_port),
                    "--log-level",
                    "error",
                    *[arg for sa in search_attributes for arg in ("--search-attribute", sa)],
                ],
            )
        )
        kube = stack.enter_context(
            process(
                "kube-fake",
                [
                    sys.executable,
                    "-m",
                    "testbed.kube_fake",
                    "--port",
                    str(kube_port),
                    "--kubeconfig",
                    str(kubeconfig),
                    "--kubelet",
                    "--nodes",
                    ",".join(NODES),
                ],
            )
        )
        await wait_for_port(temporal_port, "temporal", temporal)
        await wait_for_port(kube_port, "kube-fake", kube)
        say(f"Temporal UI: http://localhost:{ui_port}   Kubernetes API: http://127.0.0.1:{kube_port}")
        worker = stack.enter_context(
            process(
                "worker",
                [str(bin_dir / "slurm-bridge"), "worker", "--metrics-port", "0", "--health-port", "0"],
                env={
                    "TEMPORAL_ADDRESS": f"127.0.0.1:{temporal_port}",
                    "KUBECONFIG": str(kubeconfig),
                    "SLURM_REST_URL": slurm["SLURM_REST_URL"],
                    "SLURM_USER_NAME": slurm["SLURM_USER_NAME"],
                    "SLURM_JWT_FILE": slurm["SLURM_JWT_FILE"],
                },
            )
        )
        await place_sample(kubeconfig, once, ui_port)
        if worker.poll() is not None:
            raise SystemExit(f"the worker exited; see {STATE}/worker.log")
        if not once:
            say(f"running; logs in {STATE}/. Ctrl-C stops everything.")
            await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--once", action="store_true", help="exit once the sample pod has finished")
    parser.add_argument(
        "--check-ports", action="store_true", help="only check that the stack's ports are free"
    )
    arguments = parser.parse_args()
    if arguments.check_ports:
        check_ports(stack_ports())
        sys.exit(0)
    try:
        asyncio.run(main(arguments.once))
    except KeyboardInterrupt:
        say("stopped")
