"""The HTTP contract: AdmissionReview in and out, and a clear 4xx for anything that is not one."""

import json
import socket
import ssl
import time
from collections.abc import Iterator

import httpx
import pytest
import trustme

from tests.webhook.conftest import CertFiles, RunningServer, client_for, policy, start_webhook
from tests.webhook.reviews import DEPLOYMENT, MANAGED_NS, P, pod, response_of, review
from webhook import app as webhook_app
from webhook.app import Webhook
from webhook.namespaces import StaticNamespaces
from webhook.tls import ReloadingCertificate


@pytest.fixture(scope="module")
def small_server(cert_files: CertFiles) -> Iterator[RunningServer]:
    """Limits small enough to hit in a test: 64 KiB bodies, half a second to send one."""
    webhook = Webhook(
        policy=policy(),
        namespaces=StaticNamespaces([MANAGED_NS]),
        max_request_bytes=64 * 1024,
        body_timeout=0.5,
    )
    running = start_webhook(webhook, ReloadingCertificate(cert_files.cert, cert_files.key))
    yield running
    running.stop()


def status_of(answer: httpx.Response, code: int) -> str:
    assert answer.status_code == code, answer.text
    body = answer.json()
    assert body["kind"] == "Status"
    assert body["code"] == code
    assert body["status"] == "Failure"
    message: str = body["message"]
    return message


@pytest.mark.parametrize("endpoint", ["mutate", "validate"])
def test_a_review_is_answered_with_its_uid(client: httpx.Client, endpoint: str) -> None:
    sent = review(pod(), uid="705ab4f5-6393-11e8-b7cc-42010a800002")
    answer = client.post(f"/{endpoint}", json=sent)
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    assert response_of(answer.json(), sent)["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "must be an AdmissionReview object"),
        (b'"text"', "must be an AdmissionReview object"),
        (b"\xff\xfe\x00garbage", "not JSON"),
        (json.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1beta1"}).encode(), "[v1]"),
        (json.dumps({"kind": "Pod", "apiVersion": "v1"}).encode(), "expected kind AdmissionReview"),
        (json.dumps({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}).encode(), "request"),
    ],
)
def test_what_is_not_a_review_is_a_400(client: httpx.Client, body: bytes, expected: str) -> None:
    for endpoint in ("mutate", "validate"):
        answer = client.post(f"/{endpoint}", content=body, headers={"content-type": "application/json"})
        assert expected in status_of(answer, 400)


@pytest.mark.parametrize(
    ("damage", "field"),
    [
        (lambda r: r["request"].pop("uid"), "request.uid"),
        (lambda r: r["request"].update(uid=""), "request.uid"),
        (lambda r: r["request"].update(operation="PATCH"), "request.operation"),
        (lambda r: r["request"].pop("kind"), "request.kind"),
        (lambda r: r["request"].update(object=[1]), "request.object"),
        (lambda r: r["request"].update(userInfo="alice"), "request.userInfo"),
    ],
)
def test_a_malformed_review_names_the_field(client: httpx.Client, damage: object, field: str) -> None:
    sent = review(pod())
    damage(sent)  # type: ignore[operator]
    assert field in status_of(client.post("/validate", json=sent), 400)


def test_other_content_types_are_415(client: httpx.Client) -> None:
    answer = client.post(
        "/validate", content=b"a=b", headers={"content-type": "application/x-www-form-urlencoded"}
    )
    assert "application/json" in status_of(answer, 415)


def test_wrong_method_and_path_are_4xx(client: httpx.Client) -> None:
    assert client.get("/mutate").status_code == 405
    assert client.post("/mutate--v1-pod", json=review(pod())).status_code == 404


def test_a_declared_huge_body_is_refused_before_it_is_read(
    small_server: RunningServer, ca: trustme.CA
) -> None:
    with client_for(ca, small_server.url) as http:
        answer = http.post(
            "/validate", content=b"x" * (65 * 1024), headers={"content-type": "application/json"}
        )
    assert "larger than 65536 bytes" in status_of(answer, 413)


def test_a_chunked_huge_body_is_cut_off(small_server: RunningServer, ca: trustme.CA) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(20):
            yield b" " * 8192

    with client_for(ca, small_server.url) as http:
        answer = http.post("/validate", content=chunks(), headers={"content-type": "application/json"})
    assert "larger than" in status_of(answer, 413)


def test_a_client_that_stalls_gets_408_not_a_hung_connection(
    small_server: RunningServer, ca: trustme.CA
) -> None:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    started = time.monotonic()
    with (
        socket.create_connection(("127.0.0.1", small_server.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        tls.sendall(b"POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n")
        tls.sendall(b"Content-Length: 1000\r\n\r\n{")
        answer = tls.recv(65536)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert time.monotonic() - started < 5


def test_deep_nesting_is_a_400(client: httpx.Client) -> None:
    body = b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": ' + b"[" * 200_000
    body += b"]" * 200_000 + b"}"
    assert status_of(
        client.post("/validate", content=body, headers={"content-type": "application/json"}), 400
    )


def test_a_huge_object_gets_a_short_denial(client: httpx.Client) -> None:
    # A megabyte of annotations (unknown keys only warn) and 500 containers each with a bad quantity.
    bad = [
        {"name": f"c{i}", "image": "x", "resources": {"requests": {"memory": "x" * 100}}} for i in range(500)
    ]
    obj = pod(
        scheduler="slurm-bridge-scheduler",
        annotations={P + "timelimit": "9" * 1_000_000, **{f"{P}typo{i}": "x" * 1000 for i in range(500)}},
        containers=bad,
    )
    sent = review(obj)
    answer = client.post("/validate", json=sent)
    response = response_of(answer.json(), sent)
    assert not response["allowed"]
    message = response["status"]["message"]
    assert len(message) <= 4100
    assert "more)" in message
    assert 'container "c0" requests memory' in message


@pytest.mark.parametrize("endpoint", ["mutate", "validate"])
def test_an_unknown_kind_is_denied_with_the_fix(client: httpx.Client, endpoint: str) -> None:
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "hpc"},
    }
    sent = review(deployment, gvkr=DEPLOYMENT)
    response = response_of(client.post(f"/{endpoint}", json=sent).json(), sent)
    assert not response["allowed"]
    assert response["status"]["code"] == 400
    assert "apps/v1 Deployment" in response["status"]["message"]
    assert "WebhookConfiguration" in response["status"]["message"]


def test_a_bug_inside_a_decision_is_a_denial_not_a_500(
    client: httpx.Client, server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setitem(webhook_app.DECISIONS, "validate", broken)
    sent = review(pod())
    answer = client.post("/validate", json=sent)
    response = response_of(answer.json(), sent)
    assert not response["allowed"]
    assert "internal error" in response["status"]["message"]
    assert 'slurm_bridge_webhook_internal_errors_total{endpoint="validate"}' in client.get("/metrics").text


def test_health_readiness_and_metrics(client: httpx.Client) -> None:
    assert client.get("/healthz").text == "ok"
    assert client.get("/readyz").text == "ok"
    sent = review(pod(scheduler="slurm-bridge-scheduler", topologySpreadConstraints=[{"maxSkew": 1}]))
    client.post("/validate", json=sent)
    client.post("/validate", content=b"nope", headers={"content-type": "application/json"})
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    assert (
        'slurm_bridge_webhook_admission_decisions_total{allowed="false",endpoint="validate",operation="CREATE"}'
        in text
    )
    assert 'slurm_bridge_webhook_rejected_requests_total{code="400",endpoint="validate"}' in text
    assert "slurm_bridge_webhook_admission_duration_seconds_bucket" in text


def test_tls_only(server: RunningServer) -> None:
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{server.port}/healthz", timeout=5)
