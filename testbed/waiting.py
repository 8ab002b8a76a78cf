"""Waiting for a condition by polling: the one helper for it, `wait_until` (sync) and `until` (async).

Prefer an event to a poll. Where the code under test or the bed says when something changed,
wait on that, re-checked on each change and bounded by `asyncio.wait_for`/`asyncio.timeout`:

* the node cache's and `WatchedObjects`' `wait_until` (checked after each watch event);
* `FakeKubeServer.wait_for`/`wait_for_async` and the real cluster's (after each watch event);
* the e2e harness's `Stack.wait_pod` (a pod, after each of its changes);
* a condition, an `asyncio.Event`, a queue, a history followed with `wait_new_event=True`.

Poll, with this helper, only where nothing sends an event: another process's or thread's state
(a server starting, a process exiting, a file it writes), Slurm (it has no watch: ask scontrol or
slurmrestd), a Temporal query, its visibility or a Schedule's state, a readiness endpoint
computed when asked. Never sleep to let something happen: wait for what shows it happened. A
sleep is right only where time passing is the thing under test (nothing happens meanwhile, a
stream stays up a healthy while) or it paces a fault; say so beside it.

Both return the first truthy value of `check()`, so a check can hand back what it found. An
exception from `check()` ends the wait (a process that exited, say), unless it is one of
`ignoring`: the answer "not yet" of a system still coming up (a Temporal query before the
workflow's first task, a namespace not in the frontend's cache yet). On timeout they raise
`ConditionTimeout`, both an `AssertionError` (a test fails on it) and a `TimeoutError`, naming
`what` and the timeout (and the ignored exception, if the last check raised one). `what` may be
a function, called only then, to say what was last seen.
"""

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")

TIMEOUT = 10.0  # seconds; generous for a 2-core machine, and left at once when the condition holds
INTERVAL = 0.05  # seconds between checks: a cheap check; pass more for an expensive one (scontrol)

What = str | Callable[[], str]


class ConditionTimeout(AssertionError, TimeoutError):
    """A polled condition did not hold within its timeout."""


Ignoring = type[Exception] | tuple[type[Exception], ...]


class _Deadline:
    """The state of one wait: its deadline, and the exception the last check raised, if ignored."""

    def __init__(self, what: What, timeout: float) -> None:
        self.what, self.timeout = what, timeout
        self.at = time.monotonic() + timeout
        self.error: Exception | None = None

    def check_passed(self) -> None:
        """After a falsy answer (or an ignored exception): raise if the time is up."""
        if time.monotonic() < self.at:
            return
        said = self.what if isinstance(self.what, str) else self.what()
        raised = f"; the last check raised {self.error!r}" if self.error is not None else ""
        raise ConditionTimeout(
            f"timed out after {self.timeout:g} s waiting for {said}{raised}"
        ) from self.error


def wait_until(
    check: Callable[[], T | None],
    what: What,
    timeout: float = TIMEOUT,
    interval: float = INTERVAL,
    *,
    ignoring: Ignoring = (),
) -> T:
    """Call `check()` every `interval` seconds until it is truthy; return that value.

    Blocks the thread: from async code, use `until` (which may run a blocking check through
    `asyncio.to_thread`). Raises `ConditionTimeout` after `timeout` seconds.
    """
    deadline = _Deadline(what, timeout)
    while True:
        try:
            value = check()
        except ignoring as error:
            deadline.error = error
        else:
            if value:
                return value
            deadline.error = None
        deadline.check_passed()
        time.sleep(interval)


@overload
async def until(
    check: Callable[[], Awaitable[T | None]],
    what: What,
    timeout: float = ...,
    interval: float = ...,
    *,
    ignoring: Ignoring = ...,
) -> T: ...


@overload
async def until(
    check: Callable[[], T | None],
    what: What,
    timeout: float = ...,
    interval: float = ...,
    *,
    ignoring: Ignoring = ...,
) -> T: ...


async def until(
    check: Callable[[], object],
    what: What,
    timeout: float = TIMEOUT,
    interval: float = INTERVAL,
    *,
    ignoring: Ignoring = (),
) -> object:
    """Await `check()` (a plain or an async function) every `interval` seconds until it is truthy;
    return that value. A check that blocks (scontrol, a file of another process) belongs off the
    event loop: `lambda: asyncio.to_thread(blocking)`. Raises `ConditionTimeout` after `timeout` s.
    """
    deadline = _Deadline(what, timeout)
    while True:
        try:
            answer = check()
            value = await answer if inspect.isawaitable(answer) else answer
        except ignoring as error:
            deadline.error = error
        else:
            if value:
                return value
            deadline.error = None
        deadline.check_passed()
        await asyncio.sleep(interval)
