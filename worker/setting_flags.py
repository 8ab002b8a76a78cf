"""Command-line flags made from a settings model, so every setting has one and none drifts.

Each field of the model becomes `--field-name` (underscores → dashes; booleans
get `--x/--no-x`), with the field's description, its environment variable
and its default as help. A flag that is not given is None, so the environment
(or the default) applies: `settings.load` drops the Nones. Validation stays
the model's: a bad flag is reported with the setting's name, like a bad
variable.
"""

import inspect
from collections.abc import Callable
from types import NoneType, UnionType
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

import typer
from pydantic import AliasChoices
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

R = TypeVar("R")

# Help panels, by the field's first words: `slurm-bridge worker --help` groups them.
PANELS = (
    ("temporal_", "Temporal"),
    ("slurm_", "Slurm"),
    ("partition", "Slurm"),
    ("mcs_label", "Slurm"),
    ("kubeconfig", "Kubernetes"),
    ("scheduler_name", "Kubernetes"),
    ("leader_election", "Leader election"),
    ("lease_", "Leader election"),
    ("renew_deadline", "Leader election"),
    ("retry_period", "Leader election"),
)


def flag_of(field: str) -> str:
    return "--" + field.replace("_", "-")


def env_of(info: FieldInfo) -> str | None:
    alias = info.validation_alias
    return str(alias.choices[0]) if isinstance(alias, AliasChoices) else None


def _value_type(annotation: Any) -> Any:
    """The type click converts the flag to: the annotation without None; str for anything else.

    Paths stay text, so the model parses a flag as it parses the variable: an
    empty value means unset (click would make it ".").
    """
    if get_origin(annotation) in (Union, UnionType):
        options = [arg for arg in get_args(annotation) if arg is not NoneType]
        annotation = options[0] if len(options) == 1 else str
    return annotation if annotation in (str, int, float, bool) else str


def _help(info: FieldInfo) -> str:
    where = [env_of(info) or ""]
    default = info.get_default(call_default_factory=True)
    if default not in (None, ""):
        where.append(f"default {default}")
    return f"{info.description or ''} [{', '.join(w for w in where if w)}]".strip()


def _panel(field: str) -> str:
    return next((panel for prefix, panel in PANELS if field.startswith(prefix)), "Worker")


def setting_parameters(kind: type[BaseSettings]) -> list[inspect.Parameter]:
    """One keyword parameter per field of `kind`, annotated for typer."""
    parameters = []
    for field, info in kind.model_fields.items():
        value_type = _value_type(info.annotation)
        declaration = flag_of(field)
        if value_type is bool:
            declaration += f"/--no-{declaration[2:]}"
        option = typer.Option(declaration, help=_help(info), rich_help_panel=_panel(field))
        parameters.append(
            inspect.Parameter(
                field,
                inspect.Parameter.KEYWORD_ONLY,
                default=None,
                annotation=Annotated[value_type | None, option],
            )
        )
    return parameters


def with_setting_flags(kind: type[BaseSettings]) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """A typer command with a flag per setting of `kind`; it is called with them as `overrides`.

    The decorated function's first parameter receives the dict of flags
    (None where not given); its other parameters are its own options.
    """

    def decorate(command: Callable[..., R]) -> Callable[..., R]:
        signature = inspect.signature(command)
        own = list(signature.parameters.values())[1:]
        fields = set(kind.model_fields)

        def run(**given: Any) -> R:
            overrides = {name: given.pop(name) for name in list(given) if name in fields}
            return command(overrides, **given)

        run.__name__ = command.__name__
        run.__doc__ = command.__doc__
        parameters = [
            *setting_parameters(kind),
            *(p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own),
        ]
        setattr(run, "__signature__", signature.replace(parameters=parameters))  # noqa: B010
        return run

    return decorate
