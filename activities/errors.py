"""One classification of Kubernetes and Slurm errors for every activity.

Retryable: no answer, 5xx, 429, and 409 where a re-read helps (KubeError.retryable,
SlurmError.retryable decide, in the clients). Everything else cannot succeed by
asking again — a 400/403/422 from Kubernetes, a Slurm 404 on update, an answer
that does not decode — and becomes a non-retryable ApplicationError, so the
workflow sees it at once and can tell the user, instead of being pinned inside
an activity that Temporal retries forever.
"""

import functools
from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

from pydantic import ValidationError
from temporalio.exceptions import ApplicationError

from activities.kube_client import KubeError
from activities.slurm_client import SlurmError

KUBE_REJECTED = "KubernetesRejected"
SLURM_REJECTED = "SlurmRejected"
UNDECODABLE = "UndecodableAnswer"

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
