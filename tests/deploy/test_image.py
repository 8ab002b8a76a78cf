"""The image itself, built without a Docker daemon (hack/image.sh) and run as a cluster runs it.

Built once per session (`built_image`, tests/deploy/conftest.py). Each test runs the image
through `hack/image.sh run` (tests/deploy/image.py): as its numeric user, on a read-only root
filesystem with a tmpfs on /tmp, in the host's network. The worker and `doctor` run against
the local stack of the end-to-end tests (real Temporal, real Slurm, the fake API server); the
webhook answers AdmissionReviews over HTTPS. What ships is checked in the OCI archive itself,
every layer of it.
"""

import asyncio
import contextlib
import json
import re
import ssl
import sys
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import certifi
import httpx
import pytest
import trustme
import yaml
from pip._vendor import certifi as pip_certifi

from testbed.kube_fake import FakeKubeServer
from tests.deploy import image
from tests.deploy.chart import ROOT
from tests.deploy.image import Archives, BuiltImage
from tests.e2e import conftest as e2e
from tests.e2e.harness import Stack, bound, free_port, job_id_of, running_process, unique
from tests.webhook.reviews import MANAGED_NS, SCHEDULER, apply_patch, pod, response_of, review

# The end-to-end tests' stack factory (and the fixtures it needs), for the image's worker.
make_stack = e2e.make_stack
make_kube = e2e.make_kube
kube_backend = e2e.kube_backend

# The files go where docker-compose.yaml mounts them (the token where the chart does too), so
# these runs are its worker and webhook services run without Docker.
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yaml").read_text())["services"]
TOKEN_PATH = COMPOSE["worker"]["environment"]["SLURM_JWT_FILE"]
KUBECONFIG_PATH = COMPOSE["worker"]["environment"]["KUBECONFIG"]
TLS_CERT = COMPOSE["webhook"]["environment"]["WEBHOOK_TLS_CERT_FILE"]
TLS_KEY = COMPOSE["webhook"]["environment"]["WEBHOOK_TLS_KEY_FILE"]


def dockerfile_suite() -> str:
    dockerfile = (ROOT / "Dockerfile").read_text()
    match = re.search(r"^ARG DEBIAN_IMAGE=debian:([a-z]+)-\d{8}-slim$", dockerfile, re.M)
    assert match, "the Dockerfile names no debian:<suite>-<date>-slim base"
    return match.group(1)


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9_.-]+", requirement)
    assert match, requirement
    return normalized(match.group(0))


# -- the image as a process ------------------------------------------------------------------


def test_without_arguments_it_prints_the_commands(built_image: BuiltImage) -> None:
    # ENTRYPOINT slurm-bridge, CMD --help: what `docker run IMAGE` shows.
    done = image.run()
    assert done.returncode == 0, done.stderr
    for command in ("worker", "webhook", "doctor", "status", "retry"):
        assert re.search(rf"│ {command}\b", done.stdout), f"{command} missing from:\n{done.stdout}"


def test_it_runs_as_uid_10001_and_can_write_only_tmp(built_image: BuiltImage) -> None:
    script = (
        'id -u; id -g; id -G; echo "home=$HOME cwd=$PWD"; '
        'awk \'$5 == "/" { print "root-options=" $6 }\' /proc/self/mountinfo; '
        'for dir in / /etc /opt/slurm-bridge /usr/lib /var; do touch "$dir/probe" 2>&1; done; '
        "touch /tmp/probe && echo tmp-writable; touch $HOME/.probe && echo home-writable"
    )
    done = image.run("-c", script, entrypoint="/bin/sh")
    lines = done.stdout.splitlines()
    assert lines[:3] == ["10001", "10001", "10001"], done.stdout + done.stderr
    assert "home=/tmp cwd=/tmp" in lines
    assert any(line.startswith("root-options=ro,") for line in lines), lines
    refused = [line for line in lines if line.startswith("touch:")]
    assert len(refused) == 5, lines
    assert all(line.endswith("Read-only file system") for line in refused), lines
    assert "tmp-writable" in lines
    assert "home-writable" in lines


def test_its_python_is_debians_of_the_suite_the_tests_run_on(built_image: BuiltImage) -> None:
    probe = (
        "import json, os, platform, sys, importlib.metadata as m; print(json.dumps({"
        "'python': list(sys.version_info[:2]), 'executable': os.path.realpath(sys.executable), "
        "'libc': platform.libc_ver(), "
        "'os': dict(l.rstrip().split('=', 1) for l in open('/etc/os-release') if '=' in l), "
        "'dists': {d.metadata['Name']: d.version for d in m.distributions()}}))"
    )
    done = image.run("-c", probe, entrypoint="python3")
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    suite = dockerfile_suite()
    python, glibc = image.DEBIAN_SUITES[suite]
    # The Dockerfile's suite, Debian's interpreter, and the Python version this test suite runs on.
    assert found["os"]["VERSION_CODENAME"] == suite
    assert found["executable"] == f"/usr/bin/python{python}"
    assert ".".join(map(str, found["python"])) == python
    assert tuple(found["python"]) == sys.version_info[:2]
    assert found["libc"] == ["glibc", glibc]

    # Exactly the pinned versions CI tests, the runtime dependencies all there, no test tool.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {
        normalized(name): version
        for name, _, version in (
            line.partition("==")
            for line in (ROOT / "constraints.txt").read_text().splitlines()
            if "==" in line and not line.startswith("#")
        )
    }
    installed = {normalized(name): version for name, version in found["dists"].items()}
    unpinned = {name for name in installed if name not in pins} - {"pip", "setuptools", "slurm-bridge"}
    assert not unpinned, f"installed without a pin in constraints.txt: {unpinned}"
    assert {name: v for name, v in installed.items() if name in pins and pins[name] != v} == {}
    runtime = {requirement_name(r) for r in project["dependencies"]}
    assert runtime <= set(installed), runtime - set(installed)
    test_only = {requirement_name(r) for r in project["optional-dependencies"]["test"]} - runtime
    assert not test_only & set(installed), f"test dependencies in the image: {test_only & set(installed)}"


# -- against the local stack -----------------------------------------------------------------


def worker_environment(stack: Stack) -> dict[str, str]:
    """The worker's settings for this stack, with the files where the chart mounts them."""
    s = stack.settings
    return {
        "TEMPORAL_ADDRESS": stack.temporal.service_client.config.target_host,
        "TEMPORAL_TASK_QUEUE": s.temporal_task_queue,
        "SLURM_REST_URL": s.slurm_rest_url,
        "SLURM_USER_NAME": s.slurm_user_name or "",
        "SLURM_JWT_FILE": TOKEN_PATH,
        "SLURM_API_VERSION": s.slurm_api_version,
        "KUBECONFIG": KUBECONFIG_PATH,
        "SLURM_PARTITION": s.partition,
        "SCHEDULER_NAME": s.scheduler_name,
        "JOB_WATCH_INTERVAL": str(s.job_watch_interval),
        "METRICS_PORT": "0",
        "HEALTH_PORT": "0",
    }


def worker_files(stack: Stack, directory: Path) -> dict[Path, str]:
    token = Path(stack.settings.slurm_jwt_file).read_bytes()
    return {
        image.secret_file(directory / "auth-token", token): TOKEN_PATH,
        image.secret_file(directory / "kubeconfig", stack.kubeconfig.read_bytes()): KUBECONFIG_PATH,
    }


@pytest.mark.slurm
async def test_doctor_in_the_image_passes_against_the_local_stack(
    built_image: BuiltImage, make_stack: e2e.StackFactory, tmp_path: Path
) -> None:
    stack = await make_stack(nodes=1, bridge=False, scheduler_name=unique("sched"))
    done = await asyncio.to_thread(
        image.run, "doctor", "--json", env=worker_environment(stack), mounts=worker_files(stack, tmp_path)
    )
    report = json.loads(done.stdout)
    failures = [check for check in report["checks"] if check["status"] == "fail"]
    assert report["ok"], failures
    assert done.returncode == 0, done.stderr
    passed = {check["area"].split()[0].lower() for check in report["checks"] if check["status"] == "ok"}
    assert {"kubernetes", "slurm", "temporal"} <= passed, report


@pytest.mark.slurm
async def test_the_worker_in_the_image_places_a_pod(
    built_image: BuiltImage, make_stack: e2e.StackFactory, tmp_path: Path
) -> None:
    # Its own scheduler name: only this worker places the pod, and its node sync touches only
    # this test's node on the shared Slurm. No worker runs in the test process (bridge=False).
    stack = await make_stack(nodes=1, bridge=False, scheduler_name=unique("sched"))
    command = image.run_command("worker", env=worker_environment(stack), mounts=worker_files(stack, tmp_path))
    log = tmp_path / "worker.log"
    with log.open("wb") as sink:
        try:
            async with running_process(*command, stdout=sink, stderr=sink) as worker:
                stack.create_pod("solo")
                pod_ = await stack.wait_pod("solo", bound, timeout=90)
                assert job_id_of(pod_) is not None
                stack.kube.set_pod_phase(stack.namespace, "solo", "Succeeded")
                await stack.wait_pod(
                    "solo", lambda p: p is None or not p["metadata"].get("finalizers"), timeout=60
                )
                assert (await stack.handle(pod_).result()).phase == "Done"
                assert worker.returncode is None, "the worker exited early"
        finally:
            print(log.read_text(errors="replace")[-6000:])  # shown when the test fails
    # Stopped by SIGINT, as `running_process` stops it: a clean exit.
    assert worker.returncode == 0


# -- the webhook -----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def webhook_in_image(ca: trustme.CA, directory: Path) -> AsyncIterator[str]:
    """The image's webhook over HTTPS on a free port of 127.0.0.1; its URL once it listens."""
    kube = FakeKubeServer().start()  # its DeviceClasses, which the default DRA classes look up
    issued = ca.issue_cert("127.0.0.1", "localhost")
    port = free_port()
    mounts = {
        image.secret_file(directory / "tls.crt", issued.cert_chain_pems[0].bytes()): TLS_CERT,
        image.secret_file(directory / "tls.key", issued.private_key_pem.bytes()): TLS_KEY,
        image.secret_file(directory / "kubeconfig", kube.kubeconfig(directory / "kc").read_bytes()): (
            KUBECONFIG_PATH
        ),
    }
    env = {
        "WEBHOOK_TLS_CERT_FILE": TLS_CERT,
        "WEBHOOK_TLS_KEY_FILE": TLS_KEY,
        "WEBHOOK_HOST": "127.0.0.1",
        "WEBHOOK_PORT": str(port),
        "MANAGED_NAMESPACES": MANAGED_NS,
        "KUBECONFIG": KUBECONFIG_PATH,
    }
    output: list[str] = []
    try:
        async with running_process(
            *image.run_command("webhook", env=env, mounts=mounts), stderr=asyncio.subprocess.PIPE
        ) as process:
            assert process.stderr is not None
            stderr = process.stderr

            async def until_listening() -> None:
                # uvicorn says so once its socket is bound: the moment requests can come.
                while line := (await stderr.readline()).decode(errors="replace"):
                    output.append(line)
                    if "Uvicorn running on" in line:
                        return
                raise AssertionError("the webhook exited:\n" + "".join(output))

            await asyncio.wait_for(until_listening(), 60)

            async def drain() -> None:  # keep reading, so a full pipe never blocks the webhook
                while line := await stderr.readline():
                    output.append(line.decode(errors="replace"))

            draining = asyncio.create_task(drain())
            yield f"https://127.0.0.1:{port}"
            draining.cancel()
    finally:
        print("".join(output)[-4000:])
        kube.stop()


async def test_the_webhook_in_the_image_answers_over_https(built_image: BuiltImage, tmp_path: Path) -> None:
    ca = trustme.CA()
    trust = ssl.create_default_context()
    ca.configure_trust(trust)
    async with webhook_in_image(ca, tmp_path) as url, httpx.AsyncClient(verify=trust, timeout=30) as client:
        sent: dict[str, Any] = review(pod("trainer", scheduler="default-scheduler"))
        answer = await client.post(f"{url}/mutate", json=sent)
        assert answer.status_code == 200, answer.text
        response = response_of(answer.json(), sent)
        assert response["allowed"] is True
        # A pod of a managed namespace is routed to Slurm.
        mutated = apply_patch(sent["request"]["object"], response)
        assert mutated["spec"]["schedulerName"] == SCHEDULER


# -- what ships (last: the archives are written while the tests above run) ----------------

COMPILERS = re.compile(
    r"(^|/)(s?bin)/((x86_64|aarch64)-linux-gnu-)?(gcc|g\+\+|cc|c\+\+|cpp|clang|ld|as|tcc)(-[\d.]+)?$"
)
SECRET_NAMES = re.compile(
    r"(^|/)(id_(rsa|ecdsa|ed25519)|\.netrc|\.pypirc|\.git-credentials|\.env|auth-token|kubeconfig|jwt)$"
)


# A PEM private key with its body (libraries carry the bare header as a string constant).
PRIVATE_KEY = re.compile(rb"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----\r?\n[A-Za-z0-9+/=\r\n]{64}")


def pem_blocks(text: str) -> set[str]:
    return set(re.findall(r"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", text, re.S))


def host_only_certificates() -> set[str]:
    """Certificates of the build host's bundle that no public CA list has: a TLS-intercepting
    proxy's, which hack/image.sh lends pip as a build secret. Public: Debian's CA package on the
    host and the certifi bundles (certifi's, pip's) of the same pinned versions as the image's."""
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    if not bundle.exists():
        return set()
    public: set[str] = set()
    for path in Path("/usr/share/ca-certificates").rglob("*.crt"):
        public |= pem_blocks(path.read_text())
    public |= pem_blocks(Path(certifi.where()).read_text())
    public |= pem_blocks(Path(pip_certifi.where()).read_text())
    return pem_blocks(bundle.read_text()) - public


def test_what_ships_has_no_compiler_no_test_tools_and_no_secrets(
    built_image: BuiltImage, image_archives: Archives, slurm_bed_token: bytes
) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {requirement_name(r) for r in project["dependencies"]}
    test_only = {requirement_name(r) for r in project["optional-dependencies"]["test"]} - runtime
    debian_files = {
        line
        for listing in (built_image.rootfs / "var/lib/dpkg/info").glob("*.list")
        for line in listing.read_text().splitlines()
    }
    needles = {
        slurm_bed_token: "this machine's Slurm JWT",
        **{block.encode(): "a CA certificate of the build host's own" for block in host_only_certificates()},
    }
    problems = []
    files = 0
    for entry in image.layer_files(image_archives.oci):
        files += 1
        where = f"layer {entry.layer}: /{entry.path}"
        parts = entry.path.split("/")
        if COMPILERS.search(entry.path):
            problems.append(f"{where}: a compiler or linker")
        if ".git" in parts or parts[0] == "src":
            problems.append(f"{where}: repository or build-context files")
        dist = re.match(r"(.+)-[^-]+\.dist-info$", parts[-1]) if entry.kind == "dir" else None
        if dist and normalized(dist.group(1)) in test_only:
            problems.append(f"{where}: a test dependency")
        if SECRET_NAMES.search(entry.path):
            problems.append(f"{where}: named like a credential")
        for needle, what in needles.items():
            if needle in entry.content:
                problems.append(f"{where}: {what}")
        # Debian's own files are the public archive's (libgnutls carries its FIPS self-test keys).
        if f"/{entry.path}" not in debian_files and PRIVATE_KEY.search(entry.content):
            problems.append(f"{where}: a private key")
    assert files > 1000, "the archive's layers were not read"
    assert not problems, "\n".join(problems)


@pytest.fixture
def slurm_bed_token() -> bytes:
    """The Slurm test bed's JWT where the bed keeps it (hack/slurm-sid.sh), if there is one."""
    env = Path("/var/cache/slurm-bridge/slurm-sid/env")
    lines = env.read_text().splitlines() if env.exists() else []
    values = dict(line.split("=", 1) for line in lines if "=" in line)
    token = Path(values.get("SLURM_JWT_FILE", "/nonexistent"))
    # A token that cannot be read cannot have been copied into the image either.
    return token.read_bytes().strip().removeprefix(b"SLURM_JWT=") if token.exists() else b"\0no token\0"


def test_archives_carry_the_image_under_the_charts_version(
    built_image: BuiltImage, image_archives: Archives
) -> None:
    version = yaml.safe_load((ROOT / "helm/slurm-bridge/Chart.yaml").read_text())["appVersion"]
    index, manifest, oci_config, layers = image.oci_layout(image_archives.oci)
    entry, docker_config = image.docker_layout(image_archives.docker)
    # Both hold this very build: an image's id is the digest of its config.
    assert manifest["config"]["digest"] == f"sha256:{built_image.image_id}"
    assert entry["Config"] == f"{built_image.image_id}.json"
    # `ctr import` names the image by the OCI ref.name; `kind load image-archive` by RepoTags,
    # where the chart's default `slurm-bridge:<appVersion>` means docker.io/library/slurm-bridge.
    reference = f"slurm-bridge:{version}"
    assert index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] == reference
    assert f"docker.io/library/{reference}" in entry["RepoTags"]
    assert all(tag.endswith(f"/{reference}") for tag in entry["RepoTags"]), entry["RepoTags"]
    for config in (oci_config, docker_config):
        assert config["config"]["User"] == "10001:10001"
        assert config["config"]["Entrypoint"] == ["slurm-bridge"]
        assert config["rootfs"]["diff_ids"] == oci_config["rootfs"]["diff_ids"]
    assert len(layers) == len(entry["Layers"]) == built_image.layers
