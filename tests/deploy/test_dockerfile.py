"""The Dockerfiles: pinned bases, non-root runtime, one entry point.

And the local Slurm image (hack/slurm) in step with hack/slurm-sid.sh, which the tests prove.
"""

import re
import subprocess
from pathlib import Path

from tests.deploy.chart import ROOT

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
    args = dict(a.split("=", 1) for word, a in instructions(text) if word == "ARG" and "=" in a)
    images = []
    for word, rest in instructions(text):
        if word == "FROM":
            image = rest.split()[0]
            images.append(re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image))
    return images


def test_base_image_is_pinned_to_a_python_3_11_patch_release() -> None:
    images = base_images(DOCKERFILE)
    assert images
    assert all(i == images[0] for i in images), images
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?", images[0]), images[0]


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
