"""Webhook configuration: command-line flags override environment variables.

Invalid configuration stops the process at start with one line naming the
setting (`load_settings` raises `ConfigurationError`), never with a traceback.
"""

import re
from pathlib import Path
from typing import Annotated, Any

from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from bridge import keys
from bridge.device_classes import DEFAULT_DEVICE_CLASSES, DeviceClasses, parse_device_classes
from bridge.labels import LabelSelectorError, Selector, parse_selector
from clients.policy_file import PolicyPath
from webhook.app import DEFAULT_MAX_REQUEST_BYTES

_DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?")
DEFAULT_BRIDGE_SERVICE_ACCOUNT = "system:serviceaccount:slurm-bridge:slurm-bridge"


class ConfigurationError(Exception):
    """Raised with a one-line, user-facing message."""


def _env(*names: str) -> AliasChoices:
    return AliasChoices(*names)


def _comma_list(value: Any) -> Any:
    # Env vars and flags give "a,b"; a list (from code) passes through.
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


class WebhookSettings(BaseSettings):
    model_config = SettingsConfigDict(populate_by_name=True, extra="ignore")

    tls_cert_file: Path = Field(validation_alias=_env("WEBHOOK_TLS_CERT_FILE", "tls_cert_file"))
    tls_key_file: Path = Field(validation_alias=_env("WEBHOOK_TLS_KEY_FILE", "tls_key_file"))
    host: str = Field("0.0.0.0", validation_alias=_env("WEBHOOK_HOST", "host"))
    port: int = Field(9443, ge=1, le=65535, validation_alias=_env("WEBHOOK_PORT", "port"))
    managed_namespaces: Annotated[list[str], NoDecode] = Field(
        default_factory=list, validation_alias=_env("MANAGED_NAMESPACES", "managed_namespaces")
    )
    managed_namespace_selector: str | None = Field(
        None, validation_alias=_env("MANAGED_NAMESPACE_SELECTOR", "managed_namespace_selector")
    )
    scheduler_name: str = Field(
        keys.DEFAULT_SCHEDULER_NAME, validation_alias=_env("SCHEDULER_NAME", "scheduler_name")
    )
    bridge_service_accounts: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: [DEFAULT_BRIDGE_SERVICE_ACCOUNT],
        validation_alias=_env("BRIDGE_SERVICE_ACCOUNTS", "bridge_service_accounts"),
    )
    kubeconfig: str | None = Field(None, validation_alias=_env("KUBECONFIG", "kubeconfig"))
    max_request_bytes: int = Field(
        DEFAULT_MAX_REQUEST_BYTES,
        ge=64 * 1024,
        le=256 * 2**20,
        validation_alias=_env("WEBHOOK_MAX_REQUEST_BYTES", "max_request_bytes"),
    )

    # The DRA DeviceClasses pods may ask for and their Slurm meaning (docs/dra.md), as the
    # worker reads them: what the webhook admits, the worker submits.
    dra_device_classes: str = Field(
        str(DEFAULT_DEVICE_CLASSES), validation_alias=_env("DRA_DEVICE_CLASSES", "dra_device_classes")
    )

    # The tenant policy (docs/tenant-policy.md), re-read when it changes; unset or empty: none.
    tenant_policy_file: PolicyPath = Field(
        None, validation_alias=_env("TENANT_POLICY_FILE", "tenant_policy_file")
    )

    @field_validator("tls_cert_file", "tls_key_file")
    @classmethod
    def _readable(cls, value: Path) -> Path:
        try:
            value.read_bytes()
        except OSError as error:
            raise ValueError(f"cannot read {value}: {error.strerror}") from None
        return value

    @field_validator("managed_namespaces", mode="before")
    @classmethod
    def _namespaces(cls, value: Any) -> Any:
        names = _comma_list(value)
        for name in names if isinstance(names, list) else []:
            if not _DNS_LABEL.fullmatch(str(name)):
                raise ValueError(f'"{name}" is not a namespace name (lowercase letters, digits and "-")')
        return names

    @field_validator("managed_namespace_selector")
    @classmethod
    def _selector(cls, value: str | None) -> str | None:
        # Empty means "not set" (a Helm chart renders unset values as ""),
        # never "every namespace".
        if value is None or not value.strip():
            return None
        try:
            parse_selector(value)
        except LabelSelectorError as error:
            raise ValueError(str(error)) from None
        return value.strip()

    @field_validator("scheduler_name")
    @classmethod
    def _scheduler_name(cls, value: str) -> str:
        if not _DNS_SUBDOMAIN.fullmatch(value):
            raise ValueError(f'"{value}" is not a scheduler name (lowercase letters, digits, "-" and ".")')
        return value

    @field_validator("bridge_service_accounts", mode="before")
    @classmethod
    def _users(cls, value: Any) -> Any:
        return _comma_list(value)

    @field_validator("dra_device_classes")
    @classmethod
    def _device_classes(cls, value: str) -> str:
        return str(parse_device_classes(value))  # the canonical form; a mistake is a ValueError

    @property
    def device_classes(self) -> DeviceClasses:
        return parse_device_classes(self.dra_device_classes)

    @property
    def selector(self) -> Selector | None:
        return parse_selector(self.managed_namespace_selector) if self.managed_namespace_selector else None


def _setting_name(location: tuple[int | str, ...]) -> str:
    """`ENV_NAME (--flag)`, whether the error is reported under the field or the env name."""
    given = str(location[0]).lower() if location else "?"
    for field, info in WebhookSettings.model_fields.items():
        alias = info.validation_alias
        if isinstance(alias, AliasChoices) and given in (str(c).lower() for c in alias.choices):
            return f"{alias.choices[0]} (--{field.replace('_', '-')})"
    return given


def load_settings(**overrides: Any) -> WebhookSettings:
    """Environment, overridden by the flags that were given (None means not given)."""
    given = {name: value for name, value in overrides.items() if value is not None}
    try:
        return WebhookSettings(**given)
    except ValidationError as error:
        first = error.errors()[0]
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "missing":
            message = "is required"
        raise ConfigurationError(f"invalid setting {_setting_name(first['loc'])}: {message}") from None
