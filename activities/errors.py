"""One classification of Kubernetes and Slurm errors for every activity.

Retryable: no answer, 5xx, 429, and 409 where a re-read helps (KubeError.retryable,
SlurmError.retryable decide, in the clients). Everything else cannot succeed by
asking again — a 400/403/422 from Kubernetes, a Slurm 404 on update, an answer
that does not decode — and becomes a non-retryable ApplicationError, so the
workflow sees it at once and can tell the user, instead of being pinned inside
an activity that Temporal retries forever.

Slurm away (unreachable, or refusing the token) is a third case for the
placement's steps (`waits_for_slurm`): once the worker's Slurm-health gate
confirms it, the step fails at once as SLURM_UNAVAILABLE, marked non-retryable
so that Temporal hands it to the workflow instead of retrying on its own
schedule; the workflow waits for the gate's `slurm_available` signal (with a
safety timer) and then runs the step again. Retryable for the bridge, not for
Temporal's retry policy.
"""

import functools
from collections.abc import Awaitable, Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar, cast

from pydantic import ValidationError
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from bridge.failures import KUBE_REJECTED, SLURM_REJECTED, SLURM_UNAVAILABLE, UNDECODABLE
from clients.kube_client import KubeError
from clients.slurm_errors import SlurmError
from clients.slurm_health import SlurmHealth

P = ParamSpec("P")
R = TypeVar("R")


def classify(error: BaseException) -> ApplicationError | None:
    """The final form of an error that retrying cannot fix; None for a retryable one."""
    if isinstance(error, KubeError) and not error.retryable:
        return ApplicationError(str(error), type=KUBE_REJECTED, non_retryable=True)
    if isinstance(error, SlurmError) and not error.retryable:
        return ApplicationError(str(error), type=SLURM_REJECTED, non_retryable=True)
    if isinstance(error, ValidationError | ValueError) and not isinstance(error, KubeError | SlurmError):
        return ApplicationError(f"an answer could not be read: {error}", type=UNDECODABLE, non_retryable=True)
    return None


def classified(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Raise non-retryable errors as such; let retryable ones reach Temporal's retry policy."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except ApplicationError:
            raise
        except Exception as error:
            final = classify(error)
            if final is not None:
                raise final from error
            raise

    return wrapper


class HasSlurmHealth(Protocol):
    @property
    def slurm_health(self) -> SlurmHealth | None: ...


S = TypeVar("S", bound=HasSlurmHealth)


def waits_for_slurm(
    fn: Callable[Concatenate[S, P], Awaitable[R]],
) -> Callable[Concatenate[S, P], Awaitable[R]]:
    """A placement step: Slurm confirmed away → SLURM_UNAVAILABLE, for the workflow to wait on.

    A failure the gate's probe does not confirm (one slow answer) stays an ordinary
    retryable error, retried by Temporal's policy as before.
    """

    @functools.wraps(fn)
    async def wrapper(self: S, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(self, *args, **kwargs)
        except SlurmError as error:
            health = self.slurm_health
            if health is None or not await health.confirm(error):
                raise
            # Benign: an outage is expected weather, not an activity bug (no traceback per placement).
            raise ApplicationError(
                health.reason or str(error),
                type=SLURM_UNAVAILABLE,
                non_retryable=True,
                category=ApplicationErrorCategory.BENIGN,
            ) from None

    return cast(Callable[Concatenate[S, P], Awaitable[R]], wrapper)
