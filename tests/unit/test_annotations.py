import pytest

from bridge.annotations import (
    AnnotationError,
    annotation_warnings,
    parse_job_annotations,
    parse_time_limit,
)

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
                P + "max-nodes": "two",
                P + "mem-per-node": "lots",
                P + "partition": " ",
                P + "timelimit": "0",
            }
        )
    text = str(caught.value)
    assert len(caught.value.problems) == 4
    assert f'{P}max-nodes="two": must be a whole number' in text
    assert "is not a Kubernetes quantity" in text
    assert f'{P}partition=" ": must not be empty' in text
    assert "Slurm would end the job at once" in text


def test_min_nodes_above_max_nodes_is_refused() -> None:
    with pytest.raises(AnnotationError, match="min-nodes must be <= max-nodes"):
        parse_job_annotations({P + "min-nodes": "3", P + "max-nodes": "2"})


@pytest.mark.parametrize("value", ["", " ", "-1", "1.5", "99999999999", "0x10", "1e3"])
def test_priority_must_be_a_non_negative_int32(value: str) -> None:
    with pytest.raises(AnnotationError, match="priority"):
        parse_job_annotations({P + "priority": value})


# -- each key as upstream's parseAnnotations reads it (SlinkyProject/slurm-bridge,
# internal/utils/slurmjobir/annotations.go), and what Slurm 26.05 does with the value sent.


@pytest.mark.parametrize(
    ("value", "exclusive"),
    [
        ("false", False),
        ("False", False),
        (" FALSE ", False),
        ("true", True),
        ("True", True),
        # Upstream: every value but "false" (trimmed, any case) is exclusive.
        ("yes", True),
        ("no", True),
        ("0", True),
        ("1", True),
        ("", True),
        ("off", True),
    ],
)
def test_exclusive_is_every_value_but_false(value: str, exclusive: bool) -> None:
    assert parse_job_annotations({P + "exclusive": value}).exclusive is exclusive


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        # Upstream's time limit also takes unit-suffixed durations (y, w, d, h, m, s, ms, in
        # that order), rounded up to whole minutes.
        ("2h", 120),
        ("30s", 1),
        ("90s", 2),
        ("10m", 10),
        ("1d", 1440),
        ("1w", 10080),
        ("1y", 525600),
        ("1h30m", 90),
        ("1d12h", 2160),
        ("500ms", 1),
        ("1m1ms", 2),
        (" 2h ", 120),
        ("0030", 30),
        ("1-00:30:00", 1470),
    ],
)
def test_time_limit_accepts_durations(text: str, minutes: int) -> None:
    assert parse_time_limit(text) == minutes
    assert parse_job_annotations({P + "timelimit": text}).time_limit_minutes == minutes


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.5h", "is not a time limit"),
        ("30m2h", "is not a time limit"),  # units largest first, as upstream
        ("2h2h", "is not a time limit"),
        ("h", "is not a time limit"),
        ("2x", "is not a time limit"),
        ("+30", "is not a time limit"),
        ("-30", "must not be negative"),
        ("-1h", "must not be negative"),
        ("", "must not be empty"),
        ("1-", "is not a time limit"),
        ("1:2:3:4", "is not a time limit"),
        ("2147483648", "is too long"),
        ("5000y", "is too long"),
        # Zero: upstream sends 0, and Slurm (REST) ends such a job at once (TIMEOUT).
        ("0", "Slurm would end the job at once"),
        ("0s", "Slurm would end the job at once"),
        ("00:00", "Slurm would end the job at once"),
        ("0-0", "Slurm would end the job at once"),
    ],
)
def test_time_limit_refusals(text: str, expected: str) -> None:
    with pytest.raises(AnnotationError, match=expected):
        parse_job_annotations({P + "timelimit": text})


@pytest.mark.parametrize(
    ("key", "value", "field", "expected"),
    [
        # Upstream parses these with strconv.ParseInt(v, 10, 32): a leading sign is allowed.
        ("max-nodes", "+3", "max_nodes", 3),
        ("min-nodes", "+2", "min_nodes", 2),
        ("priority", "+7", "priority", 7),
        ("max-nodes", " 4 ", "max_nodes", 4),
        ("max-nodes", "007", "max_nodes", 7),
        ("priority", "-0", "priority", 0),
        # min-nodes 0: upstream sends it, and Slurm takes it (the job's node count decides).
        ("min-nodes", "0", "min_nodes", 0),
        ("priority", "0", "priority", 0),  # Slurm holds such a job (JobHeldUser), as upstream's
        ("priority", "2147483647", "priority", 2147483647),
    ],
)
def test_whole_numbers_as_upstream_parses_them(key: str, value: str, field: str, expected: int) -> None:
    assert getattr(parse_job_annotations({P + key: value}), field) == expected


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("max-nodes", "0", "must be at least 1"),  # Slurm: "Node count specification invalid"
        ("max-nodes", "-1", "must not be negative"),
        ("min-nodes", "-1", "must not be negative"),
        ("priority", "-5", "must not be negative"),
        ("min-nodes", "2147483648", "must be at most 2147483647"),
        ("min-nodes", "-2147483649", "must not be negative"),
        ("min-nodes", "1 2", "must be a whole number"),
        ("min-nodes", "\u0663", "must be a whole number"),
        ("max-nodes", "+", "must be a whole number"),
    ],
)
def test_whole_number_refusals(key: str, value: str, expected: str) -> None:
    with pytest.raises(AnnotationError, match=expected):
        parse_job_annotations({P + key: value})


@pytest.mark.parametrize(
    ("value", "cpus"),
    [("200m", 1), ("2", 2), ("1.5", 2), ("0", 0), ("0m", 0)],
)
def test_cpu_per_task_as_upstream(value: str, cpus: int) -> None:
    # 0 is sent as upstream sends it; Slurm gives such a job 1 CPU per task.
    assert parse_job_annotations({P + "cpu-per-task": value}).cpu_per_task == cpus


def test_negative_cpu_per_task_is_refused() -> None:
    # Slurm takes -1 and leaves the job pending for ever (PartitionConfig): refused here.
    with pytest.raises(AnnotationError, match="must not be negative"):
        parse_job_annotations({P + "cpu-per-task": "-1"})


@pytest.mark.parametrize(
    ("value", "mib"),
    [
        ("1Gi", 1024),
        ("512Mi", 512),
        # Upstream: the quantity's whole bytes divided by 1 MiB, rounded down.
        ("1.5Mi", 1),
        ("1G", 953),
        ("1048577", 1),
        # 0 (and below 1Mi): memory_per_node 0, Slurm's --mem=0, all of the node's memory.
        ("0", 0),
        ("512Ki", 0),
    ],
)
def test_mem_per_node_as_upstream(value: str, mib: int) -> None:
    assert parse_job_annotations({P + "mem-per-node": value}).mem_per_node_mib == mib


def test_negative_mem_per_node_is_refused() -> None:
    # Slurm would read -1 MiB as 0: all of the node's memory.
    with pytest.raises(AnnotationError, match="must not be negative"):
        parse_job_annotations({P + "mem-per-node": "-1Mi"})


@pytest.mark.parametrize("key", ["user-id", "group-id"])
@pytest.mark.parametrize(
    ("value", "expected"), [("alice", "alice"), (" alice ", "alice"), ("1000", "1000"), ("0", "0")]
)
def test_user_and_group_take_a_name_or_a_number(key: str, value: str, expected: str) -> None:
    # Upstream sends the text as is; Slurm resolves a name or a number (an unknown one is refused
    # at submission: "Unable to resolve user ID to user name").
    parsed = parse_job_annotations({P + key: value})
    assert getattr(parsed, key.replace("-", "_")) == expected


@pytest.mark.parametrize(
    "key", ["account", "constraints", "group-id", "licenses", "qos", "reservation", "user-id", "wckey"]
)
@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_value_means_slurms_default(key: str, value: str) -> None:
    # Upstream sends "" and Slurm treats it as not set; so does the bridge (a tenant policy's
    # default then applies, as to a missing annotation).
    parsed = parse_job_annotations({P + key: value})
    assert getattr(parsed, key.replace("-", "_")) is None


def test_an_empty_gres_or_job_name_is_sent_empty() -> None:
    # Upstream sends them as they are: no GRES at all (even for GPU pods), an empty job name.
    parsed = parse_job_annotations({P + "gres": "", P + "job-name": " "})
    assert (parsed.gres, parsed.job_name) == ("", "")


def test_unknown_keys_are_ignored_and_warned_about() -> None:
    annotations = {P + "timelimt": "10", P + "colour": "blue", "example.com/x": "1"}
    assert parse_job_annotations(annotations) == parse_job_annotations({})
    warnings = annotation_warnings(annotations)
    assert warnings == [
        f'annotation {P}colour="blue": unknown to slurm-bridge and ignored',
        f'annotation {P}timelimt="10": unknown to slurm-bridge and ignored; did you mean {P}timelimit?',
    ]


@pytest.mark.parametrize(("value", "warned"), [("true", False), ("FALSE", False), ("yes", True), ("", True)])
def test_an_exclusive_value_that_is_not_a_boolean_is_warned_about(value: str, warned: bool) -> None:
    warnings = annotation_warnings({P + "exclusive": value})
    assert bool(warnings) is warned
    if warned:
        assert 'only "false" shares nodes' in warnings[0]
