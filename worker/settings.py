"""Worker configuration: command-line flags override environment variables.

Invalid configuration stops the process at start with one line naming the
setting (see `load_settings`), never with a traceback.
"""

from pathlib import Path
from typing import Any, TypeVar

from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from bridge import keys


class ConfigurationError(Exception):
    """Raised with a one-line, user-facing message."""


def env(*names: str) -> AliasChoices:
    return AliasChoices(*names)


class TemporalSettings(BaseSettings):
    """Enough to talk to Temporal: what the operator commands (status, list, retry) need."""

    model_config = SettingsConfigDict(populate_by_name=True, extra="ignore")

    temporal_address: str = Field(
        "localhost:7233", validation_alias=env("TEMPORAL_ADDRESS", "temporal_address")
    )
    temporal_namespace: str = Field(
        "default", validation_alias=env("TEMPORAL_NAMESPACE", "temporal_namespace")
    )
    temporal_task_queue: str = Field(
        "slurm-bridge", validation_alias=env("TEMPORAL_TASK_QUEUE", "temporal_task_queue")
    )
    temporal_tls: bool = Field(False, validation_alias=env("TEMPORAL_TLS", "temporal_tls"))
    temporal_api_key_file: Path | None = Field(
        None, validation_alias=env("TEMPORAL_API_KEY_FILE", "temporal_api_key_file")
    )
    temporal_ui_url: str = Field(
        "http://localhost:8233", validation_alias=env("TEMPORAL_UI_URL", "temporal_ui_url")
    )
    kubeconfig: str | None = Field(None, validation_alias=env("KUBECONFIG", "kubeconfig"))

    @field_validator("temporal_address")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, _, port = value.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError("must be host:port, for example localhost:7233")
        return value


class WorkerSettings(TemporalSettings):
    slurm_rest_url: str = Field(
        "http://localhost:6820", validation_alias=env("SLURM_REST_URL", "slurm_rest_url")
    )
    slurm_user_name: str | None = Field(None, validation_alias=env("SLURM_USER_NAME", "slurm_user_name"))
    slurm_jwt_file: Path = Field(
        Path("/var/run/secrets/slurm/auth-token"), validation_alias=env("SLURM_JWT_FILE", "slurm_jwt_file")
    )
    scheduler_name: str = Field(
        keys.DEFAULT_SCHEDULER_NAME, validation_alias=env("SCHEDULER_NAME", "scheduler_name")
    )
    partition: str = Field(keys.DEFAULT_PARTITION, validation_alias=env("SLURM_PARTITION", "partition"))
    mcs_label: str = Field(keys.DEFAULT_MCS_LABEL, validation_alias=env("MCS_LABEL", "mcs_label"))
    job_watch_interval: float = Field(
        1.0, gt=0, le=300, validation_alias=env("JOB_WATCH_INTERVAL", "job_watch_interval")
    )
    node_sync_interval: float = Field(
        30.0, ge=1, le=86400, validation_alias=env("NODE_SYNC_INTERVAL", "node_sync_interval")
    )
    metrics_port: int = Field(9464, ge=0, le=65535, validation_alias=env("METRICS_PORT", "metrics_port"))

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
        # is re-read on every request afterwards, so rotation needs no restart.
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
