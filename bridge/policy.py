"""Tenant policy: which Slurm accounts, QOS, partitions, reservations and ids a namespace may use.

The bridge submits every job with its own (often administrator) Slurm token, so
the `slurmjob.slinky.slurm.net/*` annotations would otherwise let any pod
charge any account or jump the queue. An administrator writes one file:

    namespaces:
      team-a:
        allowed_accounts: [team-a, shared]
        allowed_partitions: [batch]
        max_priority: 100
        defaults: {account: team-a, partition: batch}
    default:            # namespaces not listed above
      allowed_accounts: []

A field left out allows anything (today's behaviour); an empty list allows
nothing, i.e. the annotation may not be set. No file at all: no restrictions.

`PolicySet.check` and `PolicySet.apply_defaults` are pure; the webhook and the
worker call them with the same file, so both deny with the same sentences. Reading
the file, and again when it changes, is clients/policy_file.py's.
"""

from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from bridge import keys
from bridge.annotations import JobAnnotations


class PolicyError(ValueError):
    """The policy file cannot be read or is not a valid policy; the message says where."""


class PolicyDefaults(BaseModel):
    """What a job gets when its annotations ask for none."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    account: str | None = None
    qos: str | None = None
    partition: str | None = None


class TenantPolicy(BaseModel):
    """One namespace's limits. None (left out) allows anything; [] allows nothing."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    allowed_accounts: list[str] | None = None
    allowed_qos: list[str] | None = None
    allowed_partitions: list[str] | None = None
    allowed_reservations: list[str] | None = None
    allowed_user_ids: list[int] | None = None
    allowed_group_ids: list[int] | None = None
    max_priority: int | None = Field(None, ge=0)
    defaults: PolicyDefaults = Field(default_factory=PolicyDefaults)

    @model_validator(mode="after")
    def _defaults_are_allowed(self) -> "TenantPolicy":
        for name, allowed in (
            ("account", self.allowed_accounts),
            ("qos", self.allowed_qos),
            ("partition", self.allowed_partitions),
        ):
            value = getattr(self.defaults, name)
            if value is not None and allowed is not None and not set(_items(name, value)) <= set(allowed):
                raise ValueError(f"defaults.{name} {value!r} is not in allowed_{_PLURAL[name]}")
        return self


class PolicySet(BaseModel):
    """The whole file: per-namespace policies and the `default` one for every other namespace."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespaces: dict[str, TenantPolicy] = Field(default_factory=dict)
    default: TenantPolicy | None = None

    def for_namespace(self, namespace: str) -> TenantPolicy:
        """The namespace's own policy, else `default`, else no restrictions."""
        return self.namespaces.get(namespace) or self.default or _UNRESTRICTED

    @property
    def restricts(self) -> bool:
        return bool(self.namespaces) or self.default is not None

    def check(
        self, namespace: str, job: JobAnnotations, *, fallback_partition: str | None = None
    ) -> list[str]:
        """Every way these (parsed) annotations break the namespace's policy; empty when none.

        `fallback_partition` is the deployment-wide partition a job without a
        partition annotation (and without a policy default) would go to.
        """
        policy = self.for_namespace(namespace)
        problems = []
        for name, allowed in (
            ("account", policy.allowed_accounts),
            ("qos", policy.allowed_qos),
            ("partition", policy.allowed_partitions),
            ("reservation", policy.allowed_reservations),
        ):
            value = getattr(job, name)
            if value is not None and allowed is not None and not set(_items(name, value)) <= set(allowed):
                problems.append(_denied(name, value, namespace, _PLURAL[name], allowed))
        for name, field, allowed_ids in (
            ("user-id", "user_id", policy.allowed_user_ids),
            ("group-id", "group_id", policy.allowed_group_ids),
        ):
            value = getattr(job, field)
            if value is None or allowed_ids is None:
                continue
            what = name.replace("-", " ") + "s"
            if not value.isdigit():
                # Slurm also takes a name (resolved on its own hosts): the policy cannot tell
                # which id that is, so a restricted namespace names its ids by number.
                problems.append(
                    _denied(name, value, namespace, what, [str(i) for i in allowed_ids])
                    + " (by number: a name cannot be checked against the policy)"
                )
            elif int(value) not in allowed_ids:
                problems.append(_denied(name, value, namespace, what, [str(i) for i in allowed_ids]))
        if (
            job.priority is not None
            and policy.max_priority is not None
            and job.priority > policy.max_priority
        ):
            problems.append(
                f'{keys.SLURMJOB_PREFIX}priority="{job.priority}": namespace {namespace} may ask for a '
                f"priority of at most {policy.max_priority}"
            )
        allowed_partitions = policy.allowed_partitions
        if (
            job.partition is None
            and policy.defaults.partition is None
            and fallback_partition
            and allowed_partitions is not None
            and fallback_partition not in allowed_partitions
        ):
            problems.append(
                f"no {keys.SLURMJOB_PREFIX}partition annotation, and the default partition "
                f'"{fallback_partition}" is not allowed: namespace {namespace} may use '
                f"{_allowed_list('partitions', allowed_partitions)}; set the annotation"
            )
        return problems

    def apply_defaults(self, namespace: str, job: JobAnnotations) -> JobAnnotations:
        """The annotations with the namespace's defaults filled in where the pod asked for nothing."""
        defaults = self.for_namespace(namespace).defaults
        update = {
            name: getattr(defaults, name)
            for name in ("account", "qos", "partition")
            if getattr(job, name) is None and getattr(defaults, name) is not None
        }
        return job.model_copy(update=update) if update else job


_UNRESTRICTED = TenantPolicy()
_PLURAL = {"account": "accounts", "qos": "QOS", "partition": "partitions", "reservation": "reservations"}
# Slurm takes a comma-separated list for these: every item must be allowed.
_LISTS = frozenset({"partition", "reservation"})


def _items(name: str, value: str) -> list[str]:
    if name in _LISTS:
        return [item.strip() for item in value.split(",")]
    return [value]


def _allowed_list(what: str, allowed: list[str]) -> str:
    return f"{what} {', '.join(allowed)}" if allowed else f"no {what}"


def _denied(annotation: str, value: str, namespace: str, what: str, allowed: list[str]) -> str:
    shown = value if len(value) <= 80 else value[:77] + "..."
    head = f'{keys.SLURMJOB_PREFIX}{annotation}="{shown}": namespace {namespace}'
    if not allowed:
        return f"{head} may not choose its {what}; remove the annotation"
    return f"{head} may use {what} {', '.join(allowed)}"


def parse_policy(text: str, source: str = "the tenant policy") -> PolicySet:
    """A PolicySet from YAML (or JSON) text; PolicyError naming the first problem."""
    try:
        data: Any = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise PolicyError(f"{source} is not YAML or JSON: {str(error).splitlines()[0]}") from None
    if data is None:
        return PolicySet()
    try:
        return PolicySet.model_validate(data)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        message = first["msg"].removeprefix("Value error, ")
        raise PolicyError(f"{source}: {where}: {message}") from None
