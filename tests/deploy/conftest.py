"""The image built once per session (hack/image.sh build); its size, layers and build time are
printed at the end of the run. (The chart installed on the real API server is tests/conftest.py's.)"""

from collections.abc import Iterator
from typing import Any

import pytest

from tests.deploy import image

# Lines for the end of the run: the image's figures, or why its tests were skipped (once).
_image_lines: list[str] = []


@pytest.fixture(scope="session")
def built_image() -> Iterator[image.BuiltImage]:
    """The image, built by hack/image.sh from the working tree (base and dependency layers cached);
    its archives are written in the background meanwhile (`image_archives`)."""
    reason = image.unavailable()
    if reason:
        if not _image_lines:
            _image_lines.append(f"NOTICE: the image tests were skipped: {reason}")
        pytest.skip(reason)
    try:
        built = image.build()
    except image.ImageBuildError as error:
        pytest.fail(str(error), pytrace=False)
    _image_lines.append(
        f"image {built.reference}: {built.size_bytes / 1e6:.0f} MB unpacked, {built.layers} layers; "
        f"hack/image.sh build took {built.build_seconds:.0f} s"
    )
    _exports.append(image.start_archives())
    try:
        yield built
    finally:
        _exports.pop().stop()


_exports: list[image.ArchiveExport] = []


@pytest.fixture(scope="session")
def image_archives(built_image: image.BuiltImage) -> image.Archives:
    try:
        archives = _exports[-1].result()
    except image.ImageBuildError as error:
        pytest.fail(str(error), pytrace=False)
    _image_lines.append(
        f"image archives: OCI {archives.oci.stat().st_size / 1e6:.0f} MB, docker "
        f"{archives.docker.stat().st_size / 1e6:.0f} MB, ready {archives.seconds:.0f} s after the build"
    )
    return archives


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in dict.fromkeys(_image_lines):
        terminalreporter.write_line(line, yellow=line.startswith("NOTICE"))


def pytest_sessionfinish(session: pytest.Session) -> None:
    # Under pytest-xdist the fixture runs in a worker: hand the lines to the controller.
    workeroutput: dict[str, Any] | None = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["image_lines"] = list(_image_lines)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    _image_lines.extend(getattr(node, "workeroutput", {}).get("image_lines", []))
