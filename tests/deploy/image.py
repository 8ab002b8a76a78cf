"""The image `hack/image.sh build` makes, run as a container runtime runs it (`hack/image.sh run`).

`run` gives the process the image's entry point, user, environment and working directory,
a read-only root filesystem with a fresh tmpfs on /tmp, the given files mounted read-only,
and the host's network: 127.0.0.1 in the image is the host's Temporal, slurmrestd and API
server. After a few `exec`s the process `run` starts *is* the image's process, so a signal
sent to it reaches slurm-bridge itself, as a kubelet's would.
"""

import gzip
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.deploy.chart import ROOT

SCRIPT = ROOT / "hack" / "image.sh"
UID = GID = 10001  # the Dockerfile's USER, the chart's runAsUser
# What Debian's python3 and libc are in each suite the Dockerfile may name: the production base
# and the local one are the same suite, so these are what both run.
DEBIAN_SUITES = {"bookworm": ("3.11", "2.36"), "trixie": ("3.13", "2.41")}


class ImageBuildError(Exception):
    """hack/image.sh build failed; the message ends with its output."""


@dataclass(frozen=True)
class BuiltImage:
    reference: str
    image_id: str
    rootfs: Path  # the image's files, mounted (read them; `run` mounts them read-only)
    size_bytes: int
    layers: int
    build_seconds: float


@dataclass(frozen=True)
class Archives:
    oci: Path
    docker: Path
    seconds: float


def unavailable() -> str | None:
    """Why this machine cannot build and run the image, or None when it can."""
    if os.geteuid() != 0:
        return "the image tests need root (buildah's storage, chroot, mounts): run ./dev test as root"
    if not shutil.which("buildah") and not shutil.which("apt-get"):
        return "no buildah here, and no apt-get to install it with"
    return None


def _values(output: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


def build() -> BuiltImage:
    """The image of the working tree, without its archives (`start_archives` writes them)."""
    started = time.monotonic()
    done = subprocess.run(
        [str(SCRIPT), "build", "--no-archives"], capture_output=True, text=True, timeout=1800, check=False
    )
    if done.returncode != 0:
        raise ImageBuildError(f"hack/image.sh build exited {done.returncode}:\n{done.stderr[-4000:]}")
    values = _values(done.stdout)
    return BuiltImage(
        reference=values["IMAGE"],
        image_id=values["IMAGE_ID"],
        rootfs=Path(values["ROOTFS"]),
        size_bytes=int(values["SIZE_BYTES"]),
        layers=int(values["LAYERS"]),
        build_seconds=time.monotonic() - started,
    )


@dataclass
class ArchiveExport:
    """`hack/image.sh archives` running beside the tests: compressing the layers takes tens of
    seconds, which the tests that run the image need not wait for."""

    process: subprocess.Popen[str]
    started: float

    def result(self, timeout: float = 600) -> Archives:
        out, err = self.process.communicate(timeout=timeout)
        if self.process.returncode != 0:
            raise ImageBuildError(f"hack/image.sh archives exited {self.process.returncode}:\n{err[-4000:]}")
        values = _values(out)
        return Archives(
            Path(values["OCI_ARCHIVE"]), Path(values["DOCKER_ARCHIVE"]), time.monotonic() - self.started
        )

    def stop(self) -> None:
        """Stop it if nobody asked for the archives (its buildah child too: it leads its own group)."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
        self.process.communicate(timeout=60)


def start_archives() -> ArchiveExport:
    process = subprocess.Popen(
        [str(SCRIPT), "archives"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    return ArchiveExport(process, time.monotonic())


def run_command(
    *args: str,
    env: Mapping[str, str] | None = None,
    mounts: Mapping[Path, str] | None = None,
    entrypoint: str | None = None,
) -> list[str]:
    """The command that runs the image with ARGS (`mounts`: host file -> path in the image)."""
    command = [str(SCRIPT), "run"]
    for name, value in (env or {}).items():
        command += ["-e", f"{name}={value}"]
    for source, target in (mounts or {}).items():
        command += ["-v", f"{source}:{target}"]
    if entrypoint:
        command += ["--entrypoint", entrypoint]
    return [*command, "--", *args]


def run(
    *args: str,
    env: Mapping[str, str] | None = None,
    mounts: Mapping[Path, str] | None = None,
    entrypoint: str | None = None,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        run_command(*args, env=env, mounts=mounts, entrypoint=entrypoint),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def secret_file(path: Path, content: bytes) -> Path:
    """A file only the image's user can read, as a Secret volume with the chart's fsGroup is."""
    path.write_bytes(content)
    os.chown(path, UID, GID)
    path.chmod(0o400)
    return path


# -- the archives ---------------------------------------------------------------------------


def _member(archive: tarfile.TarFile, name: str) -> bytes:
    handle = archive.extractfile(name)
    assert handle is not None, f"{name} is not a file in the archive"
    return handle.read()


def oci_layout(path: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], list[str]]:
    """The OCI archive's index.json, the image's manifest and config, its layer blobs in order."""
    with tarfile.open(path) as archive:
        index = json.loads(_member(archive, "index.json"))
        digest = index["manifests"][0]["digest"].replace(":", "/")
        manifest = json.loads(_member(archive, f"blobs/{digest}"))
        config = json.loads(_member(archive, "blobs/" + manifest["config"]["digest"].replace(":", "/")))
        layers = ["blobs/" + layer["digest"].replace(":", "/") for layer in manifest["layers"]]
    return index, manifest, config, layers


def docker_layout(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The docker archive's manifest.json entry and the image config."""
    with tarfile.open(path) as archive:
        (entry,) = json.loads(_member(archive, "manifest.json"))
        config = json.loads(_member(archive, entry["Config"]))
    return entry, config


@dataclass(frozen=True)
class LayerFile:
    layer: int
    path: str  # without a leading slash, as in the layer
    kind: str  # "file", "dir", "link", "other"
    content: bytes  # regular files only


def layer_files(path: Path) -> Iterator[LayerFile]:
    """Every entry of every layer of the OCI archive: what shipping the image ships, files that a
    later layer deletes included."""
    *_, layers = oci_layout(path)
    with tarfile.open(path) as archive:
        for number, blob in enumerate(layers):
            data = _member(archive, blob)
            stream = gzip.GzipFile(fileobj=io.BytesIO(data)) if data[:2] == b"\x1f\x8b" else io.BytesIO(data)
            with tarfile.open(fileobj=stream, mode="r|") as layer:
                for entry in layer:
                    name = entry.name.removeprefix("./")
                    if entry.isfile():
                        handle = layer.extractfile(entry)
                        content = handle.read() if handle else b""
                        yield LayerFile(number, name, "file", content)
                    elif entry.isdir():
                        yield LayerFile(number, name, "dir", b"")
                    elif entry.issym() or entry.islnk():
                        yield LayerFile(number, name, "link", b"")
                    else:
                        yield LayerFile(number, name, "other", b"")
