"""The real kube-apiserver (v1.28) + etcd of `hack/kube-apiserver.sh`, one per test session.

The binaries are found like envtest's assets: `SLURM_BRIDGE_K8S_ASSETS` names
their folder, by default `../shared/k8s` beside the repository. Where they are
absent (a fresh machine outside this workspace) the tests that need them skip
with one notice; CI has them and always runs them.

Each session gets an instance of its own, on free ports, with its own etcd data:
sessions running at once (or a killed one's leftovers) never see each other's
cluster-scoped objects. A killed session's instance is stopped by the next start.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from testbed.waiting import ConditionTimeout, wait_until

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "hack" / "kube-apiserver.sh"
INSTANCES = Path(os.environ.get("SLURM_BRIDGE_K8S_CACHE", "/var/cache/slurm-bridge/k8s")) / "instances"


# The User-Agent of a test's own deliberate requests with the bridge's token (a probe that it is
# refused something): `refused()` leaves them out.
TEST_PROBE_AGENT = "slurm-bridge-test-probe"


class ApiServerUnavailable(RuntimeError):
    """No binaries here: the tests that need the real API server skip."""


def assets_folder() -> Path | None:
    """The binaries' folder, when it holds them."""
    done = subprocess.run([str(SCRIPT), "assets"], capture_output=True, text=True, check=False)
    return Path(done.stdout.strip()) if done.returncode == 0 else None


def _start(directory: Path, port: int, etcd_port: int) -> dict[str, str]:
    """Start (what is not running of) the instance in `directory`; its KEY=VALUE lines."""
    command = [
        str(SCRIPT),
        "start",
        str(directory),
        "--port",
        str(port),
        "--etcd-port",
        str(etcd_port),
        "--owner",
        str(os.getpid()),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=180)
    if done.returncode != 0:
        raise RuntimeError(f"kube-apiserver did not start: {done.stderr.strip()[-2000:]}")
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _free_ports() -> tuple[int, int]:
    """The API server's port and etcd's client port, whose successor (etcd's peer port) is free
    too: three distinct ports, held open together while they are chosen."""
    for _ in range(50):
        with socket.socket() as api, socket.socket() as client, socket.socket() as peer:
            api.bind(("127.0.0.1", 0))
            client.bind(("127.0.0.1", 0))
            etcd_port = int(client.getsockname()[1])
            try:
                peer.bind(("127.0.0.1", etcd_port + 1))
            except OSError:
                continue
            return int(api.getsockname()[1]), etcd_port
    raise RuntimeError("no free ports for kube-apiserver and etcd on 127.0.0.1")


@dataclass(frozen=True)
class ApiServer:
    """A running instance: where it is and how to reach it as cluster admin."""

    port: int
    etcd_port: int
    directory: Path
    url: str
    ca_file: Path
    admin_token: str
    admin_kubeconfig: Path
    webhook_cert: Path
    webhook_key: Path

    @classmethod
    def start(cls) -> ApiServer:
        if assets_folder() is None:
            raise ApiServerUnavailable(
                "no kube-apiserver binaries (SLURM_BRIDGE_K8S_ASSETS, default ../shared/k8s): "
                "the tests against the real API server are skipped"
            )
        INSTANCES.mkdir(parents=True, exist_ok=True)
        directory = Path(tempfile.mkdtemp(prefix="session-", dir=INSTANCES))
        port, etcd_port = _free_ports()
        try:
            env = _start(directory, port, etcd_port)
        except RuntimeError:
            subprocess.run([str(SCRIPT), "stop", str(directory)], check=False)
            raise
        return cls(
            port=port,
            etcd_port=etcd_port,
            directory=directory,
            url=env["K8S_API"],
            ca_file=Path(env["K8S_CA"]),
            admin_token=env["K8S_ADMIN_TOKEN"],
            admin_kubeconfig=Path(env["KUBECONFIG"]),
            webhook_cert=Path(env["K8S_WEBHOOK_CERT"]),
            webhook_key=Path(env["K8S_WEBHOOK_KEY"]),
        )

    def tls_context(self) -> ssl.SSLContext:
        """A client context that trusts this server's CA."""
        return ssl.create_default_context(cafile=str(self.ca_file))

    def stop_apiserver(self) -> None:
        """An outage: kube-apiserver stops (SIGTERM), etcd and its data stay."""
        pid = int((self.directory / "kube-apiserver.pid").read_text())
        os.kill(pid, signal.SIGTERM)
        try:  # another process's end: polled, nothing here is told of it
            wait_until(
                lambda: not _running(pid), f"kube-apiserver (pid {pid}) to stop", timeout=10, interval=0.1
            )
        except ConditionTimeout:
            os.kill(pid, signal.SIGKILL)

    def start_apiserver(self) -> None:
        """The end of an outage: kube-apiserver again, on the same port and data, until ready."""
        _start(self.directory, self.port, self.etcd_port)

    def audit_offset(self) -> int:
        """Where the audit log ends now: `refused(since=...)` reads what came after."""
        with contextlib.suppress(FileNotFoundError):
            return (self.directory / "audit.log").stat().st_size
        return 0

    def refused(self, username: str, since: int = 0) -> list[str]:
        """Every request of `username` the API server refused as unauthorized or forbidden
        (401/403) after offset `since` of its audit log: "VERB /path -> code"."""
        refusals = []
        with contextlib.suppress(FileNotFoundError), (self.directory / "audit.log").open() as lines:
            lines.seek(since)
            for line in lines:
                event = json.loads(line)
                code = (event.get("responseStatus") or {}).get("code")
                if event.get("userAgent") == TEST_PROBE_AGENT:
                    continue
                if code in (401, 403) and (event.get("user") or {}).get("username") == username:
                    refusals.append(f"{event.get('verb')} {event.get('requestURI')} -> {code}")
        return refusals

    def bindings(self, namespace: str) -> list[str]:
        """The pod named by every Binding sent for a pod of `namespace`, accepted or not (from the
        API server's audit log)."""
        bound = []
        with contextlib.suppress(FileNotFoundError), (self.directory / "audit.log").open() as lines:
            for line in lines:
                event = json.loads(line)
                ref = event.get("objectRef") or {}
                if (
                    event.get("verb") == "create"
                    and ref.get("resource") == "pods"
                    and ref.get("subresource") == "binding"
                    and ref.get("namespace") == namespace
                ):
                    bound.append(str(ref.get("name")))
        return bound

    def stop(self) -> None:
        subprocess.run([str(SCRIPT), "stop", str(self.directory)], check=False, timeout=60)
        shutil.rmtree(self.directory, ignore_errors=True)

    def kubeconfig(self, path: Path, *, token: str | None = None, namespace: str = "default") -> Path:
        """A kubeconfig for this server with a bearer token (the admin's unless given)."""
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: test\n  cluster: {{server: '{self.url}', certificate-authority: "
            f"'{self.ca_file}'}}\n"
            f"users:\n- name: user\n  user: {{token: '{token or self.admin_token}'}}\n"
            f"contexts:\n- name: test\n  context: {{cluster: test, user: user, namespace: '{namespace}'}}\n"
            "current-context: test\n"
        )
        return path
