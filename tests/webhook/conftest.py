"""A running webhook over real HTTPS (test CA from trustme) and a keep-alive client for it.

The server runs in its own thread and event loop, exactly as uvicorn serves it
in production (same SSLContext wiring, same app); tests talk to it only
through HTTPS with AdmissionReview JSON.
"""

import asyncio
import http.client
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
import uvicorn

from testbed.waiting import wait_until
from tests.webhook.reviews import BRIDGE_USER, MANAGED_NS, SCHEDULER, Json, response_of
from webhook.app import Webhook, create_app
from webhook.command import build_server, uvicorn_config
from webhook.namespaces import StaticNamespaces
from webhook.policy import AdmissionPolicy
from webhook.settings import WebhookSettings
from webhook.tls import ReloadingCertificate


@dataclass
class RunningServer:
    server: uvicorn.Server
    thread: threading.Thread
    webhook: Webhook | None = None
    certificate: ReloadingCertificate | None = None

    @property
    def port(self) -> int:
        port: int = self.server.servers[0].sockets[0].getsockname()[1]
        return port

    @property
    def url(self) -> str:
        return f"https://localhost:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def run_in_thread(server: uvicorn.Server) -> threading.Thread:
    """Serve in a daemon thread; return once it accepts connections."""
    thread = threading.Thread(target=server.run, name="webhook-under-test", daemon=True)
    thread.start()

    def started() -> bool:  # another thread's server: polled
        if not thread.is_alive():
            raise RuntimeError("the webhook under test stopped while starting")
        return bool(server.started)

    wait_until(started, "the webhook under test to start", timeout=15)
    return thread


def serve_command(settings: WebhookSettings) -> RunningServer:
    """`slurm-bridge webhook` as its command builds it (its caches on the server's own event
    loop), in a daemon thread; return once it accepts connections."""
    built: list[uvicorn.Server] = []

    def serve() -> None:
        async def main() -> None:
            built.append(await build_server(settings))
            await built[0].serve()

        asyncio.run(main())

    thread = threading.Thread(target=serve, name="webhook-command-under-test", daemon=True)
    thread.start()

    def started() -> bool:  # another thread's server: polled
        if not thread.is_alive():
            raise RuntimeError("the webhook command under test stopped while starting")
        return bool(built and built[0].started)

    wait_until(started, "the webhook command under test to start", timeout=15)
    return RunningServer(built[0], thread)


def start_webhook(webhook: Webhook, certificate: ReloadingCertificate) -> RunningServer:
    server = uvicorn.Server(uvicorn_config(create_app(webhook), certificate, host="127.0.0.1", port=0))
    return RunningServer(server, run_in_thread(server), webhook, certificate)


def policy() -> AdmissionPolicy:
    return AdmissionPolicy(SCHEDULER, frozenset({BRIDGE_USER}))


@dataclass(frozen=True)
class CertFiles:
    cert: Path
    key: Path


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    return trustme.CA()


def write_cert(ca: trustme.CA, directory: Path, name: str = "tls") -> CertFiles:
    issued = ca.issue_cert("localhost", "127.0.0.1")
    files = CertFiles(directory / f"{name}.crt", directory / f"{name}.key")
    issued.private_key_pem.write_to_path(str(files.key))
    # The chain file holds leaf + intermediates, as cert-manager writes tls.crt.
    files.cert.write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
    return files


@pytest.fixture(scope="session")
def cert_files(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> CertFiles:
    return write_cert(ca, tmp_path_factory.mktemp("tls"))


def client_for(ca: trustme.CA, base_url: str, **kwargs: Any) -> httpx.Client:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return httpx.Client(base_url=base_url, verify=context, timeout=10.0, **kwargs)


@pytest.fixture(scope="session")
def server(cert_files: CertFiles) -> Iterator[RunningServer]:
    """The webhook as deployed: namespace `hpc` managed, the bridge's service account trusted."""
    webhook = Webhook(policy=policy(), namespaces=StaticNamespaces([MANAGED_NS]))
    running = start_webhook(webhook, ReloadingCertificate(cert_files.cert, cert_files.key))
    yield running
    running.stop()


@pytest.fixture(scope="session")
def client(server: RunningServer, ca: trustme.CA) -> Iterator[httpx.Client]:
    """One HTTP/1.1 keep-alive connection, like the API server's."""
    with client_for(ca, server.url) as http:
        yield http


class KeepAlive:
    """A bare HTTP/1.1 keep-alive connection (stdlib), for the ten thousand property-test requests.

    Same TLS, same wire format as httpx; it costs half as much per request,
    which is what keeps the property tests within their time budget.
    """

    def __init__(self, port: int, context: ssl.SSLContext) -> None:
        self.connection = http.client.HTTPSConnection("localhost", port, context=context, timeout=10)

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        for attempt in range(2):
            try:
                self.connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
                answer = self.connection.getresponse()
                return answer.status, answer.read()
            except (http.client.RemoteDisconnected, ConnectionError):
                # The server may close an idle connection; the API server reconnects too.
                self.connection.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.connection.close()


class Admission:
    """Post reviews to /mutate and /validate and return the checked response part."""

    def __init__(self, connection: KeepAlive) -> None:
        self.connection = connection

    def post(self, endpoint: str, review: Json) -> Json:
        status, body = self.connection.post(f"/{endpoint}", json.dumps(review).encode())
        assert status == 200, body
        return response_of(json.loads(body), review)

    def mutate(self, review: Json) -> Json:
        return self.post("mutate", review)

    def validate(self, review: Json) -> Json:
        return self.post("validate", review)


@pytest.fixture(scope="session")
def keep_alive(server: RunningServer, ca: trustme.CA) -> Iterator[KeepAlive]:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    connection = KeepAlive(server.port, context)
    yield connection
    connection.close()


@pytest.fixture(scope="session")
def admission(keep_alive: KeepAlive) -> Admission:
    return Admission(keep_alive)
