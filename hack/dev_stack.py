"""The local stack behind `./dev run`: every real part on embedded defaults.

Starts the Temporal dev server (UI on :8233), makes sure real Slurm runs with
two external nodes, serves the simulated Kubernetes API (with a simulated
kubelet), runs `slurm-bridge worker` against them, and places a sample pod.
It then keeps running until Ctrl-C, so you can `kubectl --kubeconfig
.local/kubeconfig` and browse the placement in the Temporal UI.

    python hack/dev_stack.py [--once]   # --once: exit after the sample pod finished (used by the tests)
"""

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STATE = REPO / ".local"
NODES = ["dev-node-1", "dev-node-2"]
TEMPORAL_PORT, UI_PORT, KUBE_PORT = 7233, 8233, 6443
SCHEDULER = "slurm-bridge-scheduler"


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


async def place_sample(kubeconfig: Path, once: bool) -> None:
    sys.path.insert(0, str(REPO))
    from activities.kube_client import KubeClient, KubeNotFound, api_path, load_configuration

    kube = KubeClient(await load_configuration(str(kubeconfig)))
    try:
        pods = api_path("pods", namespace="default")
        pod = await kube.request("POST", pods, body=sample_pod())
        uid = pod["metadata"]["uid"]
        link = f"http://localhost:{UI_PORT}/namespaces/default/workflows/placement%2Fdefault%2Fhello-slurm%2F{uid}"
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
                    str(TEMPORAL_PORT),
                    "--ui-port",
                    str(UI_PORT),
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
                    "tests.kube_fake",
                    "--port",
                    str(KUBE_PORT),
                    "--kubeconfig",
                    str(kubeconfig),
                    "--kubelet",
                    "--nodes",
                    ",".join(NODES),
                ],
            )
        )
        await wait_for_port(TEMPORAL_PORT, "temporal", temporal)
        await wait_for_port(KUBE_PORT, "kube-fake", kube)
        say(f"Temporal UI: http://localhost:{UI_PORT}   Kubernetes API: http://127.0.0.1:{KUBE_PORT}")
        worker = stack.enter_context(
            process(
                "worker",
                [str(bin_dir / "slurm-bridge"), "worker", "--metrics-port", "0"],
                env={
                    "TEMPORAL_ADDRESS": f"127.0.0.1:{TEMPORAL_PORT}",
                    "KUBECONFIG": str(kubeconfig),
                    "SLURM_REST_URL": slurm["SLURM_REST_URL"],
                    "SLURM_USER_NAME": slurm["SLURM_USER_NAME"],
                    "SLURM_JWT_FILE": slurm["SLURM_JWT_FILE"],
                },
            )
        )
        await place_sample(kubeconfig, once)
        if worker.poll() is not None:
            raise SystemExit(f"the worker exited; see {STATE}/worker.log")
        if not once:
            say(f"running; logs in {STATE}/. Ctrl-C stops everything.")
            await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--once", action="store_true", help="exit once the sample pod has finished")
    arguments = parser.parse_args()
    try:
        asyncio.run(main(arguments.once))
    except KeyboardInterrupt:
        say("stopped")
