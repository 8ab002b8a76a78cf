"""Worker configuration: command-line flags override environment variables.

Invalid configuration stops the process at start with one line naming the
setting (see `load_settings`), never with a traceback.

Its size (about 470 lines) is one documented field per setting: each setting's default,
bounds, variable and help live together, and the flags are made from them.
"""

from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import AliasChoices, Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from bridge import keys
from bridge.device_classes import DEFAULT_DEVICE_CLASSES, DeviceClasses, parse_device_classes
from bridge.slurm_api import API_VERSION, ApiVersion
from clients.policy_file import PolicyPath


class ConfigurationError(Exception):
    """Raised with a one-line, user-facing message."""


def env(*names: str) -> AliasChoices:
    return AliasChoices(*names)


def _read_secret(path: Path) -> bytes:
    """A secret file's bytes; ValueError (a one-line setting error) when it cannot be read."""
    try:
        return path.read_bytes()
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror}") from None


class TemporalSettings(BaseSettings):
    """Enough to talk to Temporal: what the operator commands (status, list, retry) need."""

    model_config = SettingsConfigDict(populate_by_name=True, extra="ignore")

    temporal_address: str = Field(
        "localhost:7233",
        description="Temporal frontend host:port",
        validation_alias=env("TEMPORAL_ADDRESS", "temporal_address"),
    )
    temporal_namespace: str = Field(
        "default",
        description="Temporal namespace",
        validation_alias=env("TEMPORAL_NAMESPACE", "temporal_namespace"),
    )
    temporal_task_queue: str = Field(
        "slurm-bridge",
        description="task queue of placements and their activities",
        validation_alias=env("TEMPORAL_TASK_QUEUE", "temporal_task_queue"),
    )
    temporal_tls: bool = Field(
        False,
        description="TLS to Temporal with the system CAs (implied by any TLS file or server name)",
        validation_alias=env("TEMPORAL_TLS", "temporal_tls"),
    )
    temporal_api_key_file: Path | None = Field(
        None,
        description="file holding a Temporal API key (Temporal Cloud), reloaded when it changes",
        validation_alias=env("TEMPORAL_API_KEY_FILE", "temporal_api_key_file"),
    )
    temporal_ui_url: str = Field(
        "http://localhost:8233",
        description="Temporal UI base URL, for the links the CLI prints",
        validation_alias=env("TEMPORAL_UI_URL", "temporal_ui_url"),
    )
    kubeconfig: str | None = Field(
        None,
        description="kubeconfig file; in-cluster service account if unset",
        validation_alias=env("KUBECONFIG", "kubeconfig"),
    )
    # mTLS (a self-hosted frontend with client certificates, or a Temporal Cloud
    # namespace on certificates). Any of them turns TLS on. The files are read
    # at start and watched while the worker runs: see worker/temporal_connection.py.
    temporal_tls_cert_file: Path | None = Field(
        None,
        description="client certificate (PEM) for mTLS, reloaded when it changes",
        validation_alias=env("TEMPORAL_TLS_CERT_FILE", "temporal_tls_cert_file"),
    )
    temporal_tls_key_file: Path | None = Field(
        None,
        validate_default=True,  # so "a certificate without its key" is caught
        description="its private key (PEM)",
        validation_alias=env("TEMPORAL_TLS_KEY_FILE", "temporal_tls_key_file"),
    )
    temporal_tls_ca_file: Path | None = Field(
        None,
        description="CA of the server certificate (PEM)",
        validation_alias=env("TEMPORAL_TLS_CA_FILE", "temporal_tls_ca_file"),
    )
    temporal_tls_server_name: str | None = Field(
        None,
        description="name the server certificate is checked against",
        validation_alias=env("TEMPORAL_TLS_SERVER_NAME", "temporal_tls_server_name"),
    )
    temporal_credentials_reload_interval: float = Field(
        30.0,
        ge=1,
        le=3600,
        description="seconds between checks of the credential files",
        validation_alias=env("TEMPORAL_CREDENTIALS_RELOAD_INTERVAL", "temporal_credentials_reload_interval"),
    )

    @field_validator("temporal_address")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, _, port = value.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError("must be host:port, for example localhost:7233")
        return value

    @field_validator(
        "temporal_api_key_file",
        "temporal_tls_cert_file",
        "temporal_tls_key_file",
        "temporal_tls_ca_file",
        "temporal_tls_server_name",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # The Helm chart renders every setting; an empty one means "not used".
        return None if value == "" else value

    @field_validator("temporal_api_key_file", "temporal_tls_cert_file", "temporal_tls_ca_file")
    @classmethod
    def _readable_secret(cls, value: Path | None) -> Path | None:
        if value is not None:
            _read_secret(value)
        return value

    @field_validator("temporal_tls_key_file")
    @classmethod
    def _key_with_certificate(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if (value is None) != (info.data.get("temporal_tls_cert_file") is None):
            raise ValueError("set both TEMPORAL_TLS_CERT_FILE and TEMPORAL_TLS_KEY_FILE, or neither")
        if value is not None:
            _read_secret(value)
        return value

    @property
    def temporal_tls_enabled(self) -> bool:
        """TLS on: asked for, or implied by a certificate, CA or server name."""
        return self.temporal_tls or any(
            (self.temporal_tls_cert_file, self.temporal_tls_ca_file, self.temporal_tls_server_name)
        )


class LeaseSettings(BaseSettings):
    """Where the leader's Lease is: the worker competes for it, the CLI reads who holds it."""

    model_config = SettingsConfigDict(populate_by_name=True, extra="ignore")

    lease_name: str = Field(
        "slurm-bridge",
        pattern=r"^[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?$",
        description="name of the workers' Lease (leader election)",
        validation_alias=env("LEASE_NAME", "lease_name"),
    )
    lease_namespace: str = Field(
        "",
        validate_default=True,
        description="namespace of the Lease; the pod's own if unset, else default",
        validation_alias=env("LEASE_NAMESPACE", "lease_namespace"),
    )
    service_account_namespace_file: ClassVar[Path] = Path(
        "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    )

    @field_validator("lease_namespace")
    @classmethod
    def _pod_namespace_by_default(cls, value: str) -> str:
        if value:
            return value
        try:
            # The namespace of the pod we run in, as mounted with its ServiceAccount token.
            return cls.service_account_namespace_file.read_text().strip() or "default"
        except OSError:
            return "default"


class OperatorSettings(LeaseSettings, TemporalSettings):
    """What `slurm-bridge status`, `list` and `retry` read: Temporal, Kubernetes and the Lease."""


class WorkerSettings(LeaseSettings, TemporalSettings):
    slurm_rest_url: str = Field(
        "http://localhost:6820",
        description="slurmrestd base URL",
        validation_alias=env("SLURM_REST_URL", "slurm_rest_url"),
    )
    slurm_api_version: ApiVersion = Field(
        API_VERSION,
        description="slurmrestd API version the bridge speaks: v0.0.44 or v0.0.45",
        validation_alias=env("SLURM_API_VERSION", "slurm_api_version"),
    )
    slurm_user_name: str | None = Field(
        None,
        description="X-SLURM-USER-NAME; the token's own user if unset",
        validation_alias=env("SLURM_USER_NAME", "slurm_user_name"),
    )
    slurm_jwt_file: Path = Field(
        Path("/var/run/secrets/slurm/auth-token"),
        description="file holding the Slurm JWT, read again whenever it changes",
        validation_alias=env("SLURM_JWT_FILE", "slurm_jwt_file"),
    )
    scheduler_name: str = Field(
        keys.DEFAULT_SCHEDULER_NAME,
        description="spec.schedulerName of the pods the bridge places",
        validation_alias=env("SCHEDULER_NAME", "scheduler_name"),
    )
    partition: str = Field(
        keys.DEFAULT_PARTITION,
        description="default Slurm partition",
        validation_alias=env("SLURM_PARTITION", "partition"),
    )
    heterogeneous_jobs: bool = Field(
        True,
        description="submit a group whose pods differ as one heterogeneous job, each pod sized by its "
        "own request; false: one job, every node sized by the group's largest pod",
        validation_alias=env("HETEROGENEOUS_JOBS", "heterogeneous_jobs"),
    )
    mcs_label: str = Field(
        keys.DEFAULT_MCS_LABEL,
        description="MCS label of the bridge's jobs",
        validation_alias=env("MCS_LABEL", "mcs_label"),
    )
    # Which accounts, QOS, partitions... each namespace may ask for (docs/tenant-policy.md);
    # re-read when it changes. Unset, empty or a missing file: no restrictions.
    tenant_policy_file: PolicyPath = Field(
        None,
        description="per-namespace tenant policy (YAML), re-read when it changes; none if unset",
        validation_alias=env("TENANT_POLICY_FILE", "tenant_policy_file"),
    )

    # The DRA DeviceClasses pods may ask for (deviceclass.resource.kubernetes.io/<class>) and
    # what each becomes in Slurm (docs/dra.md); the webhook reads the same setting.
    dra_device_classes: str = Field(
        str(DEFAULT_DEVICE_CLASSES),
        description="honoured DRA DeviceClasses: <class>=cpu or <class>=<gres>[:<type>], comma-separated; "
        "empty: none",
        validation_alias=env("DRA_DEVICE_CLASSES", "dra_device_classes"),
    )

    @field_validator("dra_device_classes")
    @classmethod
    def _device_classes(cls, value: str) -> str:
        return str(parse_device_classes(value))  # the canonical form; a mistake is a ValueError

    @property
    def device_classes(self) -> DeviceClasses:
        return parse_device_classes(self.dra_device_classes)

    # This installation's name in every placement id and Slurm job comment: two bridges
    # sharing one Slurm (and one MCS label) never touch each other's jobs.
    installation_id: str = Field(
        "slurm-bridge",
        pattern=r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$",
        description="this installation's name in placement ids and job comments",
        validation_alias=env("INSTALLATION_ID", "installation_id"),
    )
    # The job watcher's probe asks Slurm only about the bridge's own jobs (a few KiB),
    # so it can look often: RUNNING → bound stays well under a second.
    job_watch_interval: float = Field(
        0.25,
        gt=0,
        le=300,
        description="seconds between the job watcher's state probes",
        validation_alias=env("JOB_WATCH_INTERVAL", "job_watch_interval"),
    )
    # While Slurm is away (the Slurm-health gate is closed), how often one `GET /ping/` asks
    # whether it answers again; placements waiting for it resume within about this long.
    slurm_probe_interval: float = Field(
        2.0,
        gt=0,
        le=60,
        description="seconds between health probes while Slurm is away",
        validation_alias=env("SLURM_PROBE_INTERVAL", "slurm_probe_interval"),
    )
    # A bound pod being deleted whose kubelet never confirms (its node is gone) keeps its
    # Slurm job this long past its grace period; then the job is released (docs/operations.md).
    deletion_slack: float = Field(
        60.0,
        ge=0,
        le=86400,
        description="seconds a stuck deleted pod keeps its job past its grace period",
        validation_alias=env("DELETION_SLACK", "deletion_slack"),
    )
    # Pods whose Slurm job ended are evicted; a PodDisruptionBudget may hold an eviction back
    # this long, then the pods are deleted (with an Event saying so).
    eviction_patience: float = Field(
        300.0,
        ge=0,
        le=86400,
        description="seconds a PodDisruptionBudget may hold back an eviction",
        validation_alias=env("EVICTION_PATIENCE", "eviction_patience"),
    )
    # A placement step whose worker stops heartbeating this long (it was killed) is tried again
    # on another worker; attempts heartbeat only once they ran a third of it (worker/heartbeat.py).
    # Placements started by the operator's CLI (`retry`) or the sweep use the default.
    step_heartbeat_timeout: float = Field(
        15.0,
        ge=1,
        le=60,
        description="seconds a placement step's worker may stay silent before another takes the step",
        validation_alias=env("STEP_HEARTBEAT_TIMEOUT", "step_heartbeat_timeout"),
    )
    node_sync_interval: float = Field(
        30.0,
        ge=1,
        le=86400,
        description="seconds between scheduled node syncs",
        validation_alias=env("NODE_SYNC_INTERVAL", "node_sync_interval"),
    )
    # The orphan sweep's Temporal Schedule (docs/operations.md, "The sweep"); 0 = no sweep.
    # Each run lists every Slurm job once, so not more often than once a minute.
    sweep_interval: float = Field(
        600.0,
        ge=0,
        le=86400,
        description="seconds between orphan sweeps; 0 = off, else at least 60",
        validation_alias=env("SWEEP_INTERVAL", "sweep_interval"),
    )

    @field_validator("sweep_interval")
    @classmethod
    def _off_or_a_minute_at_least(cls, value: float) -> float:
        if 0 < value < 60:
            raise ValueError("must be 0 (no sweep) or at least 60 seconds")
        return value

    metrics_port: int = Field(
        9464,
        ge=0,
        le=65535,
        description="Prometheus port; 0 = off",
        validation_alias=env("METRICS_PORT", "metrics_port"),
    )
    # /healthz and /readyz for the kubelet's probes (worker/health.py); 0 = off.
    health_port: int = Field(
        9465,
        ge=0,
        le=65535,
        description="port of /healthz and /readyz; 0 = off",
        validation_alias=env("HEALTH_PORT", "health_port"),
    )
    # Temporal worker tuning, passed to temporalio.worker.Worker as is. The
    # cache (workflows kept in memory between tasks, sticky execution) stays
    # bounded, 0 turns it off.
    # 20 activities, not the SDK's 100: they share one event loop with the workflow tasks that
    # bind pods, and a burst of 100 submissions at once made a pod whose job runs wait seconds
    # for its bind, for no more throughput (docs/temporal.md#worker-tuning).
    temporal_max_concurrent_activities: int = Field(
        20,
        ge=1,
        le=10_000,
        description="activities run at once",
        validation_alias=env("TEMPORAL_MAX_CONCURRENT_ACTIVITIES", "temporal_max_concurrent_activities"),
    )
    # 10 workflow tasks, not the SDK's 100: the SDK hands a worker's workflow activations to
    # Python one at a time, on the event loop the activities share, and a task taken from the
    # server waits for its activations behind every other task the worker holds. With 100 held in
    # a burst, the half of a bind's task that follows the bind (a local activity) waited behind
    # ~43 other activations (0.4 s p50); tasks beyond 10 wait on the server instead
    # (docs/temporal.md#worker-tuning).
    temporal_max_concurrent_workflow_tasks: int = Field(
        10,
        ge=2,  # the SDK needs two when the cache is on (a sticky and a normal poller)
        le=10_000,
        description="workflow tasks run at once",
        validation_alias=env(
            "TEMPORAL_MAX_CONCURRENT_WORKFLOW_TASKS", "temporal_max_concurrent_workflow_tasks"
        ),
    )
    # 500, not the SDK's 1,000: a cached placement holds ~100 KiB of worker memory, and a
    # placement that waits for days is cheap to replay (a few dozen events) when evicted.
    temporal_max_cached_workflows: int = Field(
        500,
        ge=0,
        le=100_000,
        description="workflows kept in memory between tasks; 0 = no cache",
        validation_alias=env("TEMPORAL_MAX_CACHED_WORKFLOWS", "temporal_max_cached_workflows"),
    )
    # How long a workflow task waits for the worker that has the placement in its cache before any
    # worker takes it: after a worker dies, its placements' next steps wait this long (SDK: 10 s).
    temporal_sticky_timeout: float = Field(
        10.0,
        ge=1,
        le=60,
        description="seconds a workflow task waits for the worker that has the placement cached",
        validation_alias=env("TEMPORAL_STICKY_TIMEOUT", "temporal_sticky_timeout"),
    )
    # Leader election on a coordination.k8s.io/v1 Lease (clients/leader.py): the
    # watchers run on one replica at a time. Timings as client-go's, in seconds.
    leader_election: bool = Field(
        False,
        description="run the watchers in the replica holding the Lease only",
        validation_alias=env("LEADER_ELECTION", "leader_election"),
    )
    lease_duration: float = Field(
        15.0,
        ge=1,
        le=3600,
        description="seconds a standby waits for a silent leader",
        validation_alias=env("LEASE_DURATION", "lease_duration"),
    )
    renew_deadline: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="seconds the leader may fail to renew before it stops",
        validation_alias=env("RENEW_DEADLINE", "renew_deadline"),
    )
    retry_period: float = Field(
        2.0,
        gt=0,
        le=3600,
        description="seconds between Lease reads and renewals",
        validation_alias=env("RETRY_PERIOD", "retry_period"),
    )

    @field_validator("renew_deadline")
    @classmethod
    def _shorter_than_the_lease(cls, value: float, info: ValidationInfo) -> float:
        lease = info.data.get("lease_duration")
        if lease is not None and not value < lease:
            raise ValueError(f"must be less than LEASE_DURATION ({lease:g})")
        return value

    @field_validator("retry_period")
    @classmethod
    def _retries_before_the_deadline(cls, value: float, info: ValidationInfo) -> float:
        deadline = info.data.get("renew_deadline")
        if deadline is not None and not 1.2 * value < deadline:
            raise ValueError(f"1.2 x RETRY_PERIOD must be less than RENEW_DEADLINE ({deadline:g})")
        return value

    @field_validator("slurm_rest_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")

    @field_validator("slurm_jwt_file")
    @classmethod
    def _readable(cls, value: Path) -> Path:
        # Checked once at start so a missing secret mount is obvious; the file
        # is read again whenever it changes, so rotation needs no restart.
        try:
            value.read_bytes()
        except OSError as error:
            raise ValueError(f"cannot read {value}: {error.strerror}") from None
        return value


def _setting_name(kind: type[BaseSettings], location: tuple[int | str, ...]) -> str:
    field = str(location[0]) if location else "?"
    info = kind.model_fields.get(field)
    alias = info.validation_alias if info else None
    if isinstance(alias, AliasChoices):
        return f"{alias.choices[0]} (--{field.replace('_', '-')})"
    return field


S = TypeVar("S", bound=BaseSettings)


def load(kind: type[S], **overrides: Any) -> S:
    """Environment, overridden by the flags that were given (None means not given)."""
    given = {name: value for name, value in overrides.items() if value is not None}
    try:
        return kind(**given)
    except ValidationError as error:
        first = error.errors()[0]
        problem = first["msg"].removeprefix("Value error, ")
        raise ConfigurationError(f"invalid setting {_setting_name(kind, first['loc'])}: {problem}") from None


def load_settings(**overrides: Any) -> WorkerSettings:
    return load(WorkerSettings, **overrides)
