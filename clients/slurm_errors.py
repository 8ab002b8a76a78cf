"""How slurmrestd's answers become errors: one classification for every request.

Every failure is a `SlurmError` carrying Slurm's own error text and numbers, the
HTTP status and whether retrying can help. How answers map to the subclasses,
as observed against slurmrestd 26.05.5 (v0.0.44, accounting_storage/none):

  SlurmNotFound     GET/POST /job/ID, GET /resources/ID of an unknown job: 404, error 2017;
                    DELETE /job/ID of an unknown job: 200 with status[].error.code 2017;
                    DELETE or POST /node/NAME of an unknown node: 422, error 2018.
  SlurmAuthError    no token headers: 401 (text/plain "Authentication failure"); bad or
                    expired token: 511, error 1007 (GET /ping/ still answers 200, pinged
                    "DOWN"); DELETE /job/ID while slurmctld was down: 403, error 1 (EPERM).
  SlurmRejected     unknown partition: 422, error 2000; unknown node in required_nodes:
                    422, 2018; bad reservation 422, 2053; bad constraint 422, 2029; memory
                    or nodes no node has: 422, 2014 / 2025; a script with EXTERNAL_JOB: 500,
                    2189; no script without EXTERNAL_JOB: 422, 9000; malformed JSON: 400;
                    a field of the wrong type: 200 with only a warning and NO job_id;
                    update of a running job's size: 422, 2073; node busy on delete: 422,
                    2016; node exists on create: 422, 2168; unparsable node_conf: 500, -1.
  SlurmBusy         a submission while slurmctld holds MaxJobCount jobs (ended ones count
                    until MinJobAge): 422, error 2007 "MaxJobCount limit reached"; sbatch
                    sleeps and retries it, and 2016 (job creation paused), itself.
  SlurmUnavailable  connection refused/reset, timeouts; slurmctld stopped: 502, error 1800
                    after slurmrestd's own 10 s timeout (GET /jobs, /nodes, /partition,
                    POST /job/submit, /new/node), 500 with error -1 after 20 s (GET /job/ID,
                    /resources/ID), 500 with error 1000 (POST /job/ID).
  not errors        an unknown account (no accounting: accepted, 200); cpus_per_task 64 on
                    4-CPU nodes (200 with warnings, job PENDING, reason PartitionConfig).

How an answer is read: the HTTP status and the `errors` list of its JSON body decide
(`check_answer`); a body that is not a JSON object (an HTML error page, a cut answer) is
quoted, never decoded by force.
"""

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

log = logging.getLogger("clients.slurm_client")  # one logger name for the client's requests

# Slurm error numbers (slurm/slurm_errno.h) the classification needs by name.
EPERM = 1
SLURM_UNEXPECTED_MSG_ERROR = 1000
SLURM_PROTOCOL_AUTHENTICATION_ERROR = 1007
SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR = 1800
ESLURM_ERROR_ON_DESC_TO_RECORD_COPY = 2007  # no room for another job record: MaxJobCount
ESLURM_NODES_BUSY = 2016
ESLURM_INVALID_JOB_ID = 2017
ESLURM_INVALID_NODE_NAME = 2018
ESLURM_ALREADY_DONE = 2021
ESLURM_REST_AUTH_FAIL = 9008

# Answers that a fresh token fixes: the next request reads the new token file.
_AUTH_STATUSES = frozenset({401, 403, 511})
_AUTH_ERRORS = frozenset({SLURM_PROTOCOL_AUTHENTICATION_ERROR, ESLURM_REST_AUTH_FAIL, *range(6000, 6100)})
# slurmrestd could not get an answer from slurmctld: its communication errors
# (1000-1004, 1013-1025, 1800-1805), standby controllers (2027, 2131), a node
# in transition (2020) and socket timeouts (5003-5005).
_UNAVAILABLE_ERRORS = frozenset(
    {*range(1000, 1005), *range(1013, 1026), *range(1800, 1806), 2020, 2027, 2131, *range(5003, 5006)}
)
_UNAVAILABLE_STATUSES = frozenset({408, 429, 502, 503, 504})
# Error numbers that say nothing about the cause ("No error", "Unspecified error").
_UNSPECIFIC_ERRORS = frozenset({0, -1})
JOB_MISSING = frozenset({ESLURM_INVALID_JOB_ID})
# A submission refused with these is one sbatch sleeps and retries ("Slurm job queue full",
# "Job creation temporarily disabled"): slurmctld is there and will take the job later. (sbatch
# retries EAGAIN too, but slurmrestd answers its own final refusals with 11 as well.)
SUBMIT_BUSY = frozenset({ESLURM_ERROR_ON_DESC_TO_RECORD_COPY, ESLURM_NODES_BUSY})
NODE_MISSING = frozenset({ESLURM_INVALID_NODE_NAME})

_Model = TypeVar("_Model", bound=BaseModel)

# Says whether an answer's errors are expected for this call and must not raise.
Tolerate = Callable[[int, tuple["SlurmErrorDetail", ...]], bool]


@dataclass(frozen=True)
class SlurmErrorDetail:
    """One entry of a slurmrestd answer's `errors` list (or a kill status)."""

    number: int | None
    error: str = ""
    description: str = ""
    source: str = ""

    def __str__(self) -> str:
        text = self.error or self.description or "error"
        if self.description and self.description != text:
            text = f"{text} ({self.description})"
        return text if self.number is None else f"{text} [{self.number}]"


class SlurmError(Exception):
    """slurmrestd or slurmctld refused or failed a request.

    `message` is Slurm's own text; `status` the HTTP status (None when no answer
    came); `errors` the entries of the answer's `errors` list; `retryable` says
    whether the same request may succeed later without any change.
    """

    default_retryable = False

    def __init__(
        self,
        message: str,
        *,
        operation: str = "",
        status: int | None = None,
        errors: tuple[SlurmErrorDetail, ...] = (),
        retryable: bool | None = None,
    ) -> None:
        self.message = message
        self.operation = operation
        self.status = status
        self.errors = errors
        self.retryable = self.default_retryable if retryable is None else retryable
        super().__init__(self._describe())

    @property
    def error_numbers(self) -> frozenset[int]:
        return frozenset(detail.number for detail in self.errors if detail.number is not None)

    def _describe(self) -> str:
        where = f"{self.operation}: " if self.operation else ""
        status = f"HTTP {self.status}: " if self.status is not None else ""
        return f"{where}{status}{self.message}"

    def __reduce__(self) -> tuple[Any, ...]:
        # Keyword-only arguments: pickle (multiprocessing, some test runners) needs help.
        return (
            _rebuild_error,
            (type(self), self.message, self.operation, self.status, self.errors, self.retryable),
        )


class SlurmNotFound(SlurmError):
    """The job or node the request names does not exist (any more)."""


class SlurmAuthError(SlurmError):
    """slurmrestd did not accept the token; a rotated token file fixes it, so retry."""

    default_retryable = True


class SlurmRejected(SlurmError):
    """slurmrestd or slurmctld refused this request as it stands; retrying cannot help."""


class SlurmBusy(SlurmError):
    """slurmctld answered and cannot take a new job now (its job queue is full); submit later.

    Not an outage (Slurm answers everything else) and not a refusal of the job itself.
    """

    default_retryable = True


class SlurmUnavailable(SlurmError):
    """No usable answer: slurmrestd or slurmctld is down, slow or unreachable; retry."""

    default_retryable = True


def _rebuild_error(
    cls: type[SlurmError],
    message: str,
    operation: str,
    status: int | None,
    errors: tuple[SlurmErrorDetail, ...],
    retryable: bool,
) -> SlurmError:
    return cls(message, operation=operation, status=status, errors=errors, retryable=retryable)


def classify(
    status: int,
    numbers: Collection[int],
    *,
    not_found: Collection[int] = (),
    unspecified: type[SlurmError] = SlurmUnavailable,
) -> type[SlurmError]:
    """The exception class for an answer with HTTP `status` and Slurm error `numbers`.

    Slurm's error number decides before the HTTP status: slurmrestd answers 500
    for some plain rejections (2189, invalid external job) and for a stopped
    slurmctld alike. `not_found` are the numbers that mean "the object this URL
    names does not exist" (2017 for a job, 2018 for a node; 2018 in a job
    submission is a rejection). `unspecified` is the class for a 5xx with no
    telling number: slurmctld down for reads, a bad node_conf for node creation.
    """
    specific = set(numbers) - _UNSPECIFIC_ERRORS
    if status in _AUTH_STATUSES or specific & _AUTH_ERRORS:
        return SlurmAuthError
    if specific & set(not_found):
        return SlurmNotFound
    if status in _UNAVAILABLE_STATUSES or specific & _UNAVAILABLE_ERRORS:
        return SlurmUnavailable
    if specific or status < 500:
        return SlurmRejected
    return unspecified


def only_unspecific_errors(status: int, errors: tuple[SlurmErrorDetail, ...]) -> bool:
    return status == 200 and all(detail.number in _UNSPECIFIC_ERRORS for detail in errors)


def check_answer(
    response: httpx.Response,
    operation: str,
    *,
    not_found: Collection[int],
    unspecified: type[SlurmError],
    tolerate: Tolerate | None,
) -> dict[str, Any]:
    status = response.status_code
    data = json_object(response)
    errors = error_details(data)
    log_warnings(operation, data)
    log.debug("slurm %s -> %s", operation, status)
    if status >= 400 or errors:
        if tolerate is not None and tolerate(status, errors):
            return data if data is not None else {}
        if not errors and data is None:
            text = response.text.strip()[:200] or response.reason_phrase
            errors = (SlurmErrorDetail(None, text),)
        raise error_for(status, errors, operation, not_found=not_found, unspecified=unspecified)
    if data is None:
        raise SlurmUnavailable(
            f"answer is not a JSON object ({response.headers.get('content-type', 'no content type')})",
            operation=operation,
            status=status,
        )
    return data


def error_for(
    status: int,
    errors: tuple[SlurmErrorDetail, ...],
    operation: str,
    *,
    not_found: Collection[int],
    unspecified: type[SlurmError] = SlurmUnavailable,
) -> SlurmError:
    numbers = [detail.number for detail in errors if detail.number is not None]
    cls = classify(status, numbers, not_found=not_found, unspecified=unspecified)
    message = "; ".join(str(detail) for detail in errors) or f"HTTP {status}"
    return cls(message, operation=operation, status=status, errors=errors)


def json_object(response: httpx.Response) -> dict[str, Any] | None:
    if not response.content:
        return None
    try:
        data = response.json()
    except ValueError:  # 401 and 400 come as text/plain
        return None
    return data if isinstance(data, dict) else None


def error_details(data: Mapping[str, Any] | None) -> tuple[SlurmErrorDetail, ...]:
    raw = data.get("errors") if data is not None else None
    if not isinstance(raw, list):
        return ()
    return tuple(
        SlurmErrorDetail(
            number=entry.get("error_number") if isinstance(entry.get("error_number"), int) else None,
            error=str(entry.get("error") or ""),
            description=str(entry.get("description") or ""),
            source=str(entry.get("source") or ""),
        )
        for entry in raw
        if isinstance(entry, dict)
    )


def log_warnings(operation: str, data: Mapping[str, Any] | None) -> None:
    raw = data.get("warnings") if data is not None else None
    for entry in raw if isinstance(raw, list) else []:
        if isinstance(entry, dict):
            log.debug("slurm %s warning: %s (%s)", operation, entry.get("description"), entry.get("source"))


def parse_answer(model: type[_Model], data: dict[str, Any], operation: str) -> _Model:
    try:
        return model.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        message = f"unexpected answer ({error.error_count()} validation errors), at {where}: {first['msg']}"
        raise SlurmError(message, operation=operation) from None
