"""Tenant policy: the file, the checks (one sentence per violation), the defaults, and reloading."""

import os
from pathlib import Path
from typing import Any

import pytest

from bridge.annotations import JobAnnotations, parse_job_annotations
from bridge.policy import PolicyError, PolicySet, TenantPolicy, parse_policy
from bridge.translate import Defaults, TranslationError, build_pod_job
from clients.policy_file import PolicyFile

P = "slurmjob.slinky.slurm.net/"

POLICY = PolicySet.model_validate(
    {
        "namespaces": {
            "team-a": {
                "allowed_accounts": ["team-a", "shared"],
                "allowed_qos": ["normal"],
                "allowed_partitions": ["batch", "gpu"],
                "allowed_reservations": [],
                "allowed_user_ids": [1001],
                "allowed_group_ids": [2001, 2002],
                "max_priority": 100,
                "defaults": {"account": "team-a", "qos": "normal", "partition": "batch"},
            },
            "open": {},
        },
        "default": {"allowed_accounts": ["guest"], "max_priority": 0},
    }
)


def job(**annotations: str) -> JobAnnotations:
    return parse_job_annotations({P + key.replace("_", "-"): value for key, value in annotations.items()})


@pytest.mark.parametrize(
    ("namespace", "annotations", "expected"),
    [
        ("team-a", {}, []),
        ("team-a", {"account": "shared", "qos": "normal", "partition": "gpu,batch", "priority": "100"}, []),
        ("team-a", {"user_id": "1001", "group_id": "2002"}, []),
        (
            "team-a",
            {"account": "team-b"},
            [f'{P}account="team-b": namespace team-a may use accounts team-a, shared'],
        ),
        ("team-a", {"qos": "high"}, [f'{P}qos="high": namespace team-a may use QOS normal']),
        (
            "team-a",
            {"partition": "batch,admin"},
            [f'{P}partition="batch,admin": namespace team-a may use partitions batch, gpu'],
        ),
        (
            "team-a",
            {"reservation": "maint"},
            [
                f'{P}reservation="maint": namespace team-a may not choose its reservations; '
                "remove the annotation"
            ],
        ),
        ("team-a", {"user_id": "0"}, [f'{P}user-id="0": namespace team-a may use user ids 1001']),
        ("team-a", {"group_id": "0"}, [f'{P}group-id="0": namespace team-a may use group ids 2001, 2002']),
        # Slurm takes a user or group name too (upstream passes it on); a policy limiting ids
        # cannot tell which id a name is, so it wants numbers.
        (
            "team-a",
            {"user_id": "root"},
            [
                f'{P}user-id="root": namespace team-a may use user ids 1001 '
                "(by number: a name cannot be checked against the policy)"
            ],
        ),
        (
            "team-a",
            {"group_id": "wheel"},
            [
                f'{P}group-id="wheel": namespace team-a may use group ids 2001, 2002 '
                "(by number: a name cannot be checked against the policy)"
            ],
        ),
        ("open", {"user_id": "alice", "group_id": "physics"}, []),
        (
            "team-a",
            {"priority": "101"},
            [f'{P}priority="101": namespace team-a may ask for a priority of at most 100'],
        ),
        (
            "team-a",
            {"account": "root", "priority": "9999"},
            [
                f'{P}account="root": namespace team-a may use accounts team-a, shared',
                f'{P}priority="9999": namespace team-a may ask for a priority of at most 100',
            ],
        ),
        # Listed with an empty policy: no restrictions, whatever `default` says.
        ("open", {"account": "anything", "priority": "5000"}, []),
        # Not listed: `default` applies.
        ("web", {"account": "guest"}, []),
        ("web", {"account": "team-a"}, [f'{P}account="team-a": namespace web may use accounts guest']),
        ("web", {"priority": "1"}, [f'{P}priority="1": namespace web may ask for a priority of at most 0']),
    ],
)
def test_check(namespace: str, annotations: dict[str, str], expected: list[str]) -> None:
    assert POLICY.check(namespace, job(**annotations)) == expected


def test_no_policy_restricts_nothing() -> None:
    empty = PolicySet()
    assert not empty.restricts
    assert empty.check("x", job(account="root", priority="4000000", user_id="0")) == []
    assert empty.apply_defaults("x", job()) == job()


def test_without_default_unlisted_namespaces_are_unrestricted() -> None:
    policy = PolicySet(namespaces={"team-a": TenantPolicy(allowed_accounts=["team-a"])})
    assert policy.check("team-b", job(account="root")) == []
    assert policy.check("team-a", job(account="root")) != []


@pytest.mark.parametrize(
    ("namespace", "annotations", "expected"),
    [
        ("team-a", {}, {"account": "team-a", "qos": "normal", "partition": "batch"}),
        ("team-a", {"account": "shared"}, {"account": "shared", "qos": "normal", "partition": "batch"}),
        ("team-a", {"partition": "gpu"}, {"account": "team-a", "qos": "normal", "partition": "gpu"}),
        ("web", {}, {"account": None, "qos": None, "partition": None}),
    ],
)
def test_apply_defaults(namespace: str, annotations: dict[str, str], expected: dict[str, Any]) -> None:
    applied = POLICY.apply_defaults(namespace, job(**annotations))
    assert {name: getattr(applied, name) for name in expected} == expected


def test_the_deployment_partition_must_be_allowed_when_there_is_no_default() -> None:
    policy = PolicySet(namespaces={"t": TenantPolicy(allowed_partitions=["gpu"])})
    assert policy.check("t", job(), fallback_partition="gpu") == []
    (problem,) = policy.check("t", job(), fallback_partition="slurm-bridge")
    assert problem.startswith(f'no {P}partition annotation, and the default partition "slurm-bridge"')
    assert "may use partitions gpu" in problem


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("namespaces: {a: {allowed_acounts: [x]}}", "namespaces.a.allowed_acounts: Extra inputs"),
        ("namespaces: {a: {max_priority: -1}}", "namespaces.a.max_priority"),
        ("namespaces: {a: {allowed_user_ids: [root]}}", "namespaces.a.allowed_user_ids.0"),
        (
            "default: {allowed_accounts: [a], defaults: {account: b}}",
            "default: defaults.account 'b' is not in allowed_accounts",
        ),
        ("namespaces: [", "is not YAML or JSON"),
        ("[1, 2]", "(top level)"),
    ],
)
def test_a_bad_file_is_refused_with_where(text: str, expected: str) -> None:
    with pytest.raises(PolicyError) as error:
        parse_policy(text)
    assert expected in str(error.value)


def test_json_and_empty_files() -> None:
    assert parse_policy('{"default": {"allowed_qos": ["normal"]}}').default == TenantPolicy(
        allowed_qos=["normal"]
    )
    assert parse_policy("") == PolicySet()


def test_translation_enforces_the_policy_and_applies_its_defaults() -> None:
    def bare(namespace: str, annotations: dict[str, str]) -> dict[str, Any]:
        return {
            "metadata": {"namespace": namespace, "name": "p", "annotations": annotations},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
        }

    built = build_pod_job(bare("team-a", {}), defaults=Defaults(), policy=POLICY)
    assert (built.account, built.qos, built.partition) == ("team-a", "normal", "batch")
    # No policy: today's behaviour.
    assert build_pod_job(bare("team-a", {P + "account": "root"}), defaults=Defaults()).account == "root"
    with pytest.raises(TranslationError) as error:
        build_pod_job(
            bare("team-a", {P + "account": "root", P + "priority": "500"}), defaults=Defaults(), policy=POLICY
        )
    assert str(error.value) == (
        f'{P}account="root": namespace team-a may use accounts team-a, shared; '
        f'{P}priority="500": namespace team-a may ask for a priority of at most 100'
    )


def _bump(path: Path) -> None:
    # A different mtime even on coarse-grained file systems.
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))


def test_the_file_is_reread_when_it_changes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("default: {allowed_accounts: [a]}")
    source = PolicyFile(path)
    assert source.current().check("x", job(account="b")) != []
    path.write_text("default: {allowed_accounts: [a, b]}")
    _bump(path)
    assert source.current().check("x", job(account="b")) == []
    # An invalid update is logged; the last valid policy stays.
    path.write_text("default: {allowed_acounts: [a]}")
    _bump(path)
    assert source.current().check("x", job(account="b")) == []
    assert "not reloaded" in caplog.text
    # A vanished file leaves the last policy in force, too.
    path.unlink()
    assert source.current().check("x", job(account="c")) != []


def test_no_file_or_no_path_means_no_restrictions(tmp_path: Path) -> None:
    assert PolicyFile().current() == PolicySet()
    assert PolicyFile(tmp_path / "absent.yaml").current() == PolicySet()


def test_an_invalid_file_fails_at_start(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("namespaces: {a: {max_priority: high}}")
    with pytest.raises(PolicyError, match=r"namespaces\.a\.max_priority"):
        PolicyFile(path)
