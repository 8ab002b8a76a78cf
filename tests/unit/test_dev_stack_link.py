"""The link `./dev run` prints opens the sample pod's placement: the id the worker gives it."""

import importlib.util
from pathlib import Path
from types import ModuleType
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[2]


def dev_stack() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dev_stack", REPO / "hack" / "dev_stack.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("installation", "expected"), [(None, "slurm-bridge"), ("prod-a", "prod-a")])
def test_the_sample_placement_link_names_the_workers_workflow_id(
    monkeypatch: pytest.MonkeyPatch, installation: str | None, expected: str
) -> None:
    if installation is None:
        monkeypatch.delenv("INSTALLATION_ID", raising=False)
    else:
        monkeypatch.setenv("INSTALLATION_ID", installation)
    link = dev_stack().placement_link(8233, "u-1")
    prefix = "http://localhost:8233/namespaces/default/workflows/"
    assert link.startswith(prefix)
    # docs/architecture.md, "Placement ids": placement/<installation>/<namespace>/<pod>/<pod uid>
    assert unquote(link.removeprefix(prefix)) == f"placement/{expected}/default/hello-slurm/u-1"
