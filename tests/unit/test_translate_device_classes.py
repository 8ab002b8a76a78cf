"""The job a DRA pod becomes under DRA_DEVICE_CLASSES: the worker's translation and `explain` alike."""

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bridge import keys
from bridge.device_classes import parse_device_classes
from bridge.translate import Defaults, GroupShape, TranslationError, build_job, build_pod_job
from worker.cli import app
from worker.explain import explain

D = keys.DRA_RESOURCE_PREFIX
H100 = "gpu.h100.example.com"
CUSTOM = Defaults(
    device_classes=parse_device_classes(f"{H100}=gpu:h100,gpu.nvidia.com=gpu,cpu.example.com=cpu")
)


def pod(name: str, requests: dict[str, str], **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", **meta},
        "spec": {
            "schedulerName": keys.DEFAULT_SCHEDULER_NAME,
            "containers": [
                {"name": "main", "image": "x", "resources": {"requests": requests, "limits": requests}}
            ],
        },
    }


def test_a_typed_class_asks_slurm_for_its_typed_gres() -> None:
    job = build_pod_job(pod("p", {D + H100: "2", "cpu": "1"}), defaults=CUSTOM)
    assert (job.tres_per_node, job.cpus_per_task) == ("gres/gpu:h100=2", 1)


def test_an_untyped_class_asks_for_any_gpu_as_by_default() -> None:
    assert build_pod_job(pod("p", {D + "gpu.nvidia.com": "3"}), defaults=CUSTOM).tres_per_node == "gres/gpu=3"
    assert (
        build_pod_job(pod("p", {D + "gpu.nvidia.com": "3"}), defaults=Defaults()).tres_per_node
        == "gres/gpu=3"
    )


def test_a_cpu_class_sets_the_jobs_cpus() -> None:
    assert build_pod_job(pod("p", {D + "cpu.example.com": "6"}), defaults=CUSTOM).cpus_per_task == 6


def test_a_class_not_configured_is_refused_with_the_setting_named() -> None:
    with pytest.raises(TranslationError) as caught:
        build_pod_job(pod("p", {D + "dra.cpu": "2"}), defaults=CUSTOM)
    assert 'uses unsupported DRA device class "dra.cpu"' in str(caught.value)
    assert "DRA_DEVICE_CLASSES" in str(caught.value)


def test_a_group_asking_one_gres_with_two_types_is_refused() -> None:
    pods = [pod("a", {D + H100: "1"}), pod("b", {"nvidia.com/gpu": "1"})]
    with pytest.raises(TranslationError) as caught:
        build_job(pods, annotations=None, shape=GroupShape(name="g"), defaults=CUSTOM)
    assert "g: the pods ask for gres/gpu and gres/gpu:h100 on each node" in str(caught.value)


async def test_explain_shows_what_the_worker_would_submit_under_the_setting() -> None:
    [job] = await explain([pod("p", {D + H100: "1"})], CUSTOM)
    assert job.job_desc_msg["tres_per_node"] == "gres/gpu:h100=1"
    [row] = job.dra_devices
    assert (row["resource"], row["slurm"]) == (D + H100, "tres_per_node gres/gpu:h100")


def test_the_explain_command_reads_the_setting_and_names_it_when_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = tmp_path / "pod.json"
    manifest.write_text(json.dumps(pod("p", {D + H100: "1"})))
    monkeypatch.setenv("DRA_DEVICE_CLASSES", f"{H100}=gpu:h100")
    shown = CliRunner().invoke(app, ["explain", str(manifest)])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)[0]["job_desc_msg"]["tres_per_node"] == "gres/gpu:h100=1"

    wrong = CliRunner().invoke(app, ["explain", str(manifest), "--dra-device-classes", H100])
    assert wrong.exit_code == 2
    assert wrong.output.strip().startswith(
        "slurm-bridge: invalid setting DRA_DEVICE_CLASSES (--dra-device-classes)"
    )
