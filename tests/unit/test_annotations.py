import pytest

from bridge.annotations import AnnotationError, parse_job_annotations, parse_time_limit

P = "slurmjob.slinky.slurm.net/"


def test_all_eighteen_keys_map_to_their_fields() -> None:
    parsed = parse_job_annotations(
        {
            P + "account": "physics",
            P + "constraints": "a100&ib",
            P + "cpu-per-task": "1500m",
            P + "exclusive": "False",
            P + "gres": "gres/gpu:a100=2",
            P + "group-id": "1000",
            P + "job-name": "train",
            P + "licenses": "matlab:1",
            P + "max-nodes": "4",
            P + "mem-per-node": "2Gi",
            P + "min-nodes": "2",
            P + "partition": "gpu",
            P + "priority": "100",
            P + "qos": "high",
            P + "reservation": "maint",
            P + "timelimit": "1-00:00:30",
            P + "user-id": "1001",
            P + "wckey": "proj",
            "unrelated.example.com/key": "ignored",
        }
    )
    assert parsed.model_dump() == {
        "account": "physics",
        "constraints": "a100&ib",
        "cpu_per_task": 2,
        "exclusive": False,
        "gres": "gres/gpu:a100=2",
        "group_id": "1000",
        "job_name": "train",
        "licenses": "matlab:1",
        "max_nodes": 4,
        "mem_per_node_mib": 2048,
        "min_nodes": 2,
        "partition": "gpu",
        "priority": 100,
        "qos": "high",
        "reservation": "maint",
        "time_limit_minutes": 1441,
        "time_limit_infinite": False,
        "user_id": "1001",
        "wckey": "proj",
    }


@pytest.mark.parametrize(
    ("text", "minutes"),
    [("30", 30), ("05:30", 6), ("02:00:00", 120), ("1-2", 1560), ("1-02:03", 1563), ("0-0:0:1", 1)],
)
def test_time_limit_accepts_slurm_formats(text: str, minutes: int) -> None:
    assert parse_time_limit(text) == minutes


def test_unlimited_time_limit() -> None:
    parsed = parse_job_annotations({P + "timelimit": "UNLIMITED"})
    assert parsed.time_limit_infinite
    assert parsed.time_limit_minutes is None


def test_every_problem_is_reported_with_key_and_remedy() -> None:
    with pytest.raises(AnnotationError) as caught:
        parse_job_annotations(
            {
                P + "timelimt": "10",
                P + "max-nodes": "two",
                P + "mem-per-node": "lots",
                P + "exclusive": "yes",
                P + "timelimit": "0",
            }
        )
    text = str(caught.value)
    assert len(caught.value.problems) == 5
    assert f"did you mean {P}timelimit?" in text
    assert f'{P}max-nodes="two": must be a whole number' in text
    assert "is not a Kubernetes quantity" in text
    assert 'must be "true" or "false"' in text
    assert "at least one minute" in text


def test_min_nodes_above_max_nodes_is_refused() -> None:
    with pytest.raises(AnnotationError, match="min-nodes must be <= max-nodes"):
        parse_job_annotations({P + "min-nodes": "3", P + "max-nodes": "2"})


@pytest.mark.parametrize("value", ["", " ", "-1", "1.5", "99999999999"])
def test_priority_must_be_a_non_negative_int32(value: str) -> None:
    with pytest.raises(AnnotationError, match="priority"):
        parse_job_annotations({P + "priority": value})
