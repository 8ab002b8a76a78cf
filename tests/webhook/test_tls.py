"""Certificate rotation: a renewed certificate is served to new connections without a restart."""

import os
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from tests.webhook.conftest import RunningServer, client_for, policy, start_webhook
from tests.webhook.reviews import MANAGED_NS, pod, review
from webhook.app import Webhook
from webhook.namespaces import StaticNamespaces
from webhook.tls import CertificateError, ReloadingCertificate


class SecretVolume:
    """Files laid out as the kubelet mounts a Secret: tls.crt -> ..data/tls.crt, ..data -> a versioned dir.

    An update writes a new versioned dir and swaps the `..data` symlink in one rename.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.version = 0

    @property
    def cert(self) -> Path:
        return self.root / "tls.crt"

    @property
    def key(self) -> Path:
        return self.root / "tls.key"

    def write(self, issued: trustme.LeafCert) -> None:
        self.version += 1
        versioned = self.root / f"..v{self.version}"
        versioned.mkdir()
        (versioned / "tls.crt").write_bytes(b"".join(b.bytes() for b in issued.cert_chain_pems))
        (versioned / "tls.key").write_bytes(issued.private_key_pem.bytes())
        temporary = self.root / "..data_tmp"
        temporary.symlink_to(versioned.name)
        os.replace(temporary, self.root / "..data")
        for name in ("tls.crt", "tls.key"):
            if not (self.root / name).is_symlink():
                (self.root / name).symlink_to(f"..data/{name}")


def der(issued: trustme.LeafCert) -> bytes:
    return ssl.PEM_cert_to_DER_cert(issued.cert_chain_pems[0].bytes().decode())


def served_certificate(port: int, ca: trustme.CA) -> bytes:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        served = tls.getpeercert(binary_form=True)
    assert served is not None
    return served


@pytest.fixture
def volume(tmp_path: Path) -> SecretVolume:
    return SecretVolume(tmp_path)


@pytest.fixture
def rotating(volume: SecretVolume, ca: trustme.CA) -> Iterator[tuple[RunningServer, trustme.LeafCert]]:
    first = ca.issue_cert("localhost", "127.0.0.1")
    volume.write(first)
    certificate = ReloadingCertificate(volume.cert, volume.key, check_interval=0)
    running = start_webhook(Webhook(policy=policy(), namespaces=StaticNamespaces([MANAGED_NS])), certificate)
    yield running, first
    running.stop()


def test_a_rotated_certificate_is_served_without_restart(
    rotating: tuple[RunningServer, trustme.LeafCert], volume: SecretVolume, ca: trustme.CA
) -> None:
    running, first = rotating
    assert served_certificate(running.port, ca) == der(first)
    with client_for(ca, running.url) as kept_open:
        assert kept_open.post("/validate", json=review(pod())).status_code == 200
        renewed = ca.issue_cert("localhost", "127.0.0.1")
        volume.write(renewed)
        assert served_certificate(running.port, ca) == der(renewed)
        # A connection opened before the rotation keeps working.
        assert kept_open.post("/validate", json=review(pod())).status_code == 200
    assert running.certificate is not None
    assert running.certificate.reloads == 1


def test_a_new_ca_is_picked_up_too(
    rotating: tuple[RunningServer, trustme.LeafCert], volume: SecretVolume
) -> None:
    running, _ = rotating
    new_ca = trustme.CA()
    renewed = new_ca.issue_cert("localhost", "127.0.0.1")
    volume.write(renewed)
    assert served_certificate(running.port, new_ca) == der(renewed)


def test_a_half_written_rotation_keeps_the_previous_certificate(
    rotating: tuple[RunningServer, trustme.LeafCert], volume: SecretVolume, ca: trustme.CA
) -> None:
    running, first = rotating
    renewed = ca.issue_cert("localhost", "127.0.0.1")
    # The certificate file is replaced first (not through ..data): it no longer matches the key.
    (volume.cert).unlink()
    volume.cert.write_bytes(renewed.cert_chain_pems[0].bytes())
    assert served_certificate(running.port, ca) == der(first)
    assert running.certificate is not None
    assert running.certificate.failed_reloads >= 1
    volume.key.unlink()
    volume.key.write_bytes(renewed.private_key_pem.bytes())
    assert served_certificate(running.port, ca) == der(renewed)


def test_checks_are_rate_limited(volume: SecretVolume, ca: trustme.CA) -> None:
    volume.write(ca.issue_cert("localhost"))
    certificate = ReloadingCertificate(volume.cert, volume.key, check_interval=3600)
    first = certificate.current()
    volume.write(ca.issue_cert("localhost"))
    assert certificate.current() is first  # not re-checked within the interval
    certificate.check_interval = 0  # no wait: with no interval, every call checks
    assert certificate.current() is not first


def test_unloadable_files_are_a_clear_error(tmp_path: Path, ca: trustme.CA) -> None:
    issued = ca.issue_cert("localhost")
    key = tmp_path / "tls.key"
    issued.private_key_pem.write_to_path(str(key))
    with pytest.raises(CertificateError, match="cannot read"):
        ReloadingCertificate(tmp_path / "missing.crt", key)
    with pytest.raises(CertificateError, match="must be a PEM certificate"):
        ReloadingCertificate(key, key)
