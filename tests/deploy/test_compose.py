"""docker-compose.yaml is valid Compose and wires the bridge as documented.

The Compose specification schema comes vendored inside the check-jsonschema
wheel (`--builtin-schema vendor.compose-spec`): nothing is downloaded.
"""

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import yaml
from pydantic import AliasChoices

from tests.deploy.chart import CHART, ROOT, manifests
from webhook.settings import WebhookSettings
from worker.settings import WorkerSettings

COMPOSE = ROOT / "docker-compose.yaml"


def check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def load() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(document, dict)
    return document


def test_compose_file_matches_the_compose_specification() -> None:
    result = check_compose(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_check_rejects_an_invalid_compose_file(tmp_path: Path) -> None:
    broken = load()
    broken["services"]["worker"]["restart"] = ["always"]  # must be a string
    broken["services"]["temporal"]["port"] = ["7233:7233"]  # not a service key
    path = tmp_path / "docker-compose.yaml"
    path.write_text(yaml.safe_dump(broken))
    result = check_compose(path)
    assert result.returncode != 0
    assert "port" in result.stdout + result.stderr


def test_third_party_images_are_pinned() -> None:
    for name, service in load()["services"].items():
        if "build" in service:
            continue
        image = service["image"]
        tag = image.rpartition(":")[2]
        assert ":" in image, f"{name}: {image} has no tag"
        assert re.fullmatch(r"\d+(\.\d+)+", tag), f"{name}: {image} is not pinned to a version"


def test_temporal_server_schema_tools_and_cli_are_one_version() -> None:
    services = load()["services"]
    versions = {
        services[s]["image"].rpartition(":")[2] for s in ("temporal", "temporal-schema", "temporal-namespace")
    }
    assert len(versions) == 1, versions


def test_worker_and_webhook_are_built_from_the_dockerfile() -> None:
    services = load()["services"]
    for name, command in (("worker", ["worker"]), ("webhook", ["webhook"])):
        service = services[name]
        assert service["build"]["context"] == "."
        assert service["command"] == command
        assert service["read_only"] is True
        assert service["cap_drop"] == ["ALL"]
    assert services["webhook"]["profiles"] == ["webhook"]


def test_bridge_image_is_the_one_the_chart_deploys_and_the_build_tags() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    image = yaml.safe_load((CHART / "values.yaml").read_text())["image"]
    # hack/image.sh tags the image and names its archives slurm-bridge:<appVersion>; the
    # package's own version is the same release.
    reference = f"{image['repository']}:{image['tag'] or chart['appVersion']}"
    assert reference == f"slurm-bridge:{chart['appVersion']}"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["version"] == chart["appVersion"]
    services = load()["services"]
    assert services["worker"]["image"] == services["webhook"]["image"] == reference
    deployed = {
        container["image"]
        for document in manifests()
        if document["kind"] == "Deployment"
        for container in document["spec"]["template"]["spec"]["containers"]
    }
    assert deployed == {reference}
    # Compose runs it as the image's own user unless told otherwise.
    dockerfile_user = re.findall(r"^USER (\S+)$", (ROOT / "Dockerfile").read_text(), re.M)[-1]
    assert services["worker"]["user"] == f"${{SLURM_BRIDGE_USER:-{dockerfile_user}}}"


def _env_names(settings: type[Any]) -> set[str]:
    names = set()
    for field in settings.model_fields.values():
        assert isinstance(field.validation_alias, AliasChoices)
        names.add(str(field.validation_alias.choices[0]))
    return names


def test_bridge_environment_is_what_the_bridge_reads() -> None:
    services = load()["services"]
    assert set(services["worker"]["environment"]) <= _env_names(WorkerSettings)
    assert set(services["webhook"]["environment"]) <= _env_names(WebhookSettings)
    worker = services["worker"]
    token_dir = next(v.rsplit(":", 2)[1] for v in worker["volumes"] if "SLURM_TOKEN_DIR" in str(v))
    kubeconfig = next(v for v in worker["volumes"] if isinstance(v, dict))
    assert kubeconfig["target"] == worker["environment"]["KUBECONFIG"]
    assert kubeconfig["bind"] == {"create_host_path": False}
    assert worker["environment"]["SLURM_JWT_FILE"] == f"{token_dir}/auth-token"


def test_slurm_profile_builds_the_local_controller_and_shares_the_token() -> None:
    services = load()["services"]
    slurm = services["slurm"]
    assert slurm["profiles"] == ["slurm"]
    assert slurm["build"]["context"] == "hack/slurm"
    assert (ROOT / "hack" / "slurm" / "Dockerfile").is_file()
    # The worker waits for it only when the profile is active.
    assert services["worker"]["depends_on"]["slurm"] == {"condition": "service_healthy", "required": False}
    # The controller writes the token where the worker reads it.
    token_volume = next(v for v in slurm["volumes"] if "SLURM_TOKEN_DIR" in str(v))
    worker_sources = {v.rsplit(":", 2)[0] for v in services["worker"]["volumes"] if isinstance(v, str)}
    assert token_volume.rsplit(":", 1)[0] in worker_sources
    assert services["worker"]["environment"]["SLURM_REST_URL"].endswith("http://slurm:6820}")


def test_inline_scripts_are_valid_shell(tmp_path: Path) -> None:
    scripts = [
        (name, service["command"][0])
        for name, service in load()["services"].items()
        if service.get("entrypoint", [None])[0] == "/bin/sh"
    ]
    assert scripts
    for name, script in scripts:
        # Compose turns "$$" into "$" before the shell sees the script.
        path = tmp_path / f"{name}.sh"
        path.write_text(script.replace("$$", "$"))
        result = subprocess.run(
            ["sh", "-n", str(path)], capture_output=True, text=True, timeout=30, check=False
        )
        assert result.returncode == 0, f"{name}: {result.stderr}"
        assert not re.search(r"(?<!\$)\$(?!\$)", script), f"{name}: a single $ is interpolated by Compose"
