"""Placement ids (a Slurm job's comment) → workflow id and installation (docs/architecture.md)."""

import pytest

from bridge.models import installation_of, workflow_id_of


@pytest.mark.parametrize(
    ("placement_id", "workflow_id", "installation"),
    [
        # New format: placement/<installation>/<group key>@<generation>.
        (
            "placement/prod-a/team-a/web-0/0b1c-uid@0b1c-uid",
            "placement/prod-a/team-a/web-0/0b1c-uid",
            "prod-a",
        ),
        (
            "placement/slurm-bridge/team-a/lws/llm-0/1f0c@8d2e",
            "placement/slurm-bridge/team-a/lws/llm-0/1f0c",
            "slurm-bridge",
        ),
        (
            "placement/prod-a/team-a/podgroup/train/77aa@8d2e",
            "placement/prod-a/team-a/podgroup/train/77aa",
            "prod-a",
        ),
    ],
)
def test_placement_id_parts(placement_id: str, workflow_id: str, installation: str) -> None:
    assert workflow_id_of(placement_id) == workflow_id
    assert installation_of(placement_id) == installation


def test_the_generation_is_after_the_last_at() -> None:
    assert workflow_id_of("placement/i/ns/a@b@gen") == "placement/i/ns/a@b"


@pytest.mark.parametrize("comment", ["", "placement", "team-a/web-0", '{"pods":[]}', "Placement/i/ns/p@g"])
def test_not_a_placement_id(comment: str) -> None:
    with pytest.raises(ValueError, match="not a placement id"):
        workflow_id_of(comment)
    with pytest.raises(ValueError, match="not a placement id"):
        installation_of(comment)


@pytest.mark.parametrize(
    "placement_id",
    [
        "placement/prod-a@gen",
        "placement/@gen",
        "placement//ns/p@gen",
        "placement/prod-a/ns/p@",
        "placement/@",
        # No generation: the ids of the first bridges, which no bridge writes any more.
        "placement/team-a/web-0/0b1c-uid",
        "placement/team-a/lws/llm-0/1f0c",
    ],
)
def test_malformed_placement_ids_are_refused(placement_id: str) -> None:
    with pytest.raises(ValueError, match="malformed placement id"):
        installation_of(placement_id)
    with pytest.raises(ValueError, match="malformed placement id"):
        workflow_id_of(placement_id)
