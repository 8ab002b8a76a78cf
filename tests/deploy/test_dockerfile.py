"""The Dockerfiles: pinned bases, non-root runtime, one entry point.

And the local Slurm image (hack/slurm) in step with hack/slurm-sid.sh, which the tests prove.
"""

import re
import subprocess
import tomllib
from pathlib import Path

from tests.deploy.chart import ROOT
from tests.deploy.image import DEBIAN_SUITES

DOCKERFILE = (ROOT / "Dockerfile").read_text()
SLURM_DIR = ROOT / "hack" / "slurm"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(
        r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    )
    result = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            result.append((word.upper(), rest.strip()))
    return result


def base_images(text: str) -> list[str]:
    """The images the FROM lines name, build args resolved; earlier stages (FROM base) left out."""
    args = dict(a.split("=", 1) for word, a in instructions(text) if word == "ARG" and "=" in a)
    images = []
    stages = set()
    for word, rest in instructions(text):
        if word == "FROM":
            image, *alias = rest.split()
            if image not in stages:
                images.append(re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image))
            if alias[:1] == ["AS"] or alias[:1] == ["as"]:
                stages.add(alias[1])
    return images


def test_base_is_a_dated_debian_slim_whose_python_the_project_is_tested_on() -> None:
    images = base_images(DOCKERFILE)
    assert len(images) == 1, f"one base for every stage, got {images}"
    match = re.fullmatch(r"debian:([a-z]+)-\d{8}-slim", images[0])
    assert match, f"{images[0]}: pin a dated Debian slim build, e.g. debian:bookworm-20251229-slim"
    # Debian's python3 of that suite must be the Python the project is tested and type-checked on
    # (tests/deploy/test_image.py checks the built image against the same table).
    python, _ = DEBIAN_SUITES[match.group(1)]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["tool"]["mypy"]["python_version"] == python
    assert pyproject["tool"]["ruff"]["target-version"] == "py" + python.replace(".", "")
    assert pyproject["project"]["requires-python"] == f">={python}"
    # Python comes from Debian's archive, in both the build and the runtime stages.
    installs = [
        rest for word, rest in instructions(DOCKERFILE) if word == "RUN" and "apt-get install" in rest
    ]
    assert any(re.search(r"\bpython3\b", run) for run in installs), installs


def test_image_script_is_valid_bash_and_reads_the_base_from_the_dockerfile() -> None:
    script = ROOT / "hack" / "image.sh"
    assert script.stat().st_mode & 0o111
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)
    # The local base stands for the Dockerfile's: the script takes its name from the ARG.
    assert "ARG DEBIAN_IMAGE=" in script.read_text()


def test_runtime_stage_runs_as_a_numeric_non_root_user() -> None:
    steps = instructions(DOCKERFILE)
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    users = [rest for word, rest in steps[last_from:] if word == "USER"]
    assert users, "the runtime stage sets no USER"
    uid, _, gid = users[-1].partition(":")
    # Numeric, so Kubernetes can enforce runAsNonRoot; the chart runs as the same ids.
    assert uid.isdigit(), uid
    assert int(uid) != 0
    assert not gid or int(gid) != 0
    values = (ROOT / "helm" / "slurm-bridge" / "values.yaml").read_text()
    assert f"runAsUser: {uid}" in values


def test_one_entry_point_for_worker_and_webhook() -> None:
    assert ("ENTRYPOINT", '["slurm-bridge"]') in instructions(DOCKERFILE)


def test_dependencies_are_installed_with_the_pinned_constraints() -> None:
    installs = [rest for word, rest in instructions(DOCKERFILE) if word == "RUN" and "pip install" in rest]
    assert installs
    for run in installs:
        for command in re.split(r"&&", run):
            if "pip install" in command and "pip==" not in command:
                assert "-c constraints.txt" in command, command


def test_build_context_carries_what_pip_needs() -> None:
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignored if line.startswith("!")}
    copied = {
        part.rstrip("/")
        for word, rest in instructions(DOCKERFILE)
        if word == "COPY" and "--from" not in rest
        for part in rest.split()[:-1]
    }
    assert copied <= allowed, f"COPY of files the .dockerignore excludes: {copied - allowed}"
    assert "*" in ignored  # allow-list: nothing else reaches the build


def test_slurm_image_is_debian_sid_with_the_packages_of_the_test_bed() -> None:
    text = (SLURM_DIR / "Dockerfile").read_text()
    assert base_images(text) == ["debian:sid-slim"]
    for package in ("slurmctld", "slurmrestd", "slurm-wlm-jwt-plugin", "munge"):
        assert re.search(rf"\b{package}\b", text), package


def test_slurm_entrypoint_is_valid_bash_and_executable() -> None:
    entrypoint = SLURM_DIR / "entrypoint.sh"
    assert entrypoint.stat().st_mode & 0o111
    subprocess.run(["bash", "-n", str(entrypoint)], check=True, timeout=30)


def _conf_lines(script: Path) -> dict[str, str]:
    """The slurm.conf a script writes (its first here-document that sets ClusterName)."""
    text = script.read_text()
    match = re.search(r"<<\s*'?(\w+)'?\n(.*?ClusterName=.*?)\n\1\n", text, flags=re.DOTALL)
    assert match, f"no slurm.conf here-document in {script}"
    settings = {}
    for line in match.group(2).splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            settings[key] = value
    return settings


def test_slurm_conf_is_the_one_the_tests_prove() -> None:
    # hack/slurm-sid.sh runs under the end-to-end tests; the image must not drift from it.
    proven = _conf_lines(ROOT / "hack" / "slurm-sid.sh")
    image = _conf_lines(SLURM_DIR / "entrypoint.sh")
    # Paths, host and ports differ by design (container layout, default ports).
    local = {"SlurmctldHost", "SlurmctldPort", "StateSaveLocation", "SlurmctldLogFile", "SlurmctldPidFile"}
    assert {k: v for k, v in image.items() if k not in local} == {
        k: v for k, v in proven.items() if k not in local
    }
    assert "sched_interval=1" in image["SchedulerParameters"]
    assert "bf_interval=1" in image["SchedulerParameters"]
