"""The Slurm-health gate: one replica's view of whether Slurm can be used at all.

Every worker replica keeps one `SlurmHealth` next to its `SlurmClient`. It costs
nothing while Slurm answers: it probes only after a request failed because
Slurm could not be reached or refused the bridge's token (`suspect`, `confirm`).
If the probe (`GET /ping/`: is a controller responding, with this token?) fails
too, the gate closes: the client then refuses every request at once without
sending it (`refusal`), so no placement, watcher or activity hammers a
slurmrestd that is away, and a prober alone asks, every `probe_interval`
seconds. The first probe that succeeds opens the gate again and tells its
listeners (the leader's waker, worker/slurm_waker.py, which signals the
placements waiting for Slurm, and the job watcher, which stops backing off).

`GET /ping/` answers 200 both when slurmctld is down and when the token is bad
(then no controller is `responding`), so one cheap request tells "usable" from
"not usable"; why it is not is taken from the request that failed (an expired
token, a refused connection), never containing the token.
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from clients.slurm_errors import SlurmAuthError, SlurmError, SlurmUnavailable

log = logging.getLogger(__name__)

DEFAULT_PROBE_INTERVAL = 2.0

Probe = Callable[[], Awaitable[None]]


def outage_reason(error: SlurmError) -> str:
    """What the pods and the log are told about why Slurm cannot be used (never the token)."""
    if isinstance(error, SlurmAuthError):
        return (
            "slurmrestd refuses the bridge's token (expired, invalid or unreadable SLURM_JWT_FILE; "
            f"write a valid token to the file, no restart needed): {error}"
        )
    return f"Slurm does not answer: {error}"


class SlurmHealth:
    """Open while Slurm answers; closed from a confirmed failure until a probe succeeds."""

    def __init__(
        self,
        probe: Probe,
        *,
        probe_interval: float = DEFAULT_PROBE_INTERVAL,
        observer: Callable[[bool], None] | None = None,
    ) -> None:
        self._probe = probe
        self.probe_interval = probe_interval
        self.observer = observer  # told True/False at each change: metrics
        self.available = True
        self.reason = ""
        self.down_since: float | None = None  # wall-clock time the gate closed
        # Counters, for metrics and tests.
        self.outages = 0
        self.probes = 0
        self._checking: asyncio.Task[bool] | None = None
        self._open = asyncio.Event()
        self._open.set()
        self._closed = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []

    # -- what the client and the activities ask --------------------------------

    def refusal(self, operation: str) -> SlurmUnavailable | None:
        """The error to raise instead of sending a request while the gate is closed."""
        if self.available:
            return None
        return SlurmUnavailable(f"not sent, Slurm is unavailable: {self.reason}", operation=operation)

    def suspect(self, error: SlurmError) -> None:
        """A request failed as Slurm being away: check, in the background, whether it is."""
        if self.available and isinstance(error, SlurmUnavailable | SlurmAuthError):
            self._check(error)

    async def confirm(self, error: SlurmError) -> bool:
        """True when Slurm is away: the gate is closed, or a probe after `error` fails too.

        Concurrent callers share one probe, so a hundred activities failing at
        once cost slurmrestd one ping.
        """
        if not self.available:
            return True
        if not isinstance(error, SlurmUnavailable | SlurmAuthError):
            return False
        return not await asyncio.shield(self._check(error))

    async def wait_available(self, timeout: float | None = None) -> bool:
        """Until the gate is open (or `timeout` passes); whether it is."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._open.wait(), timeout)
        return self.available

    def on_recovery(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener` each time the gate opens again; returns a function that stops it."""
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    # -- the prober --------------------------------------------------------------

    async def run(self) -> None:
        """Until cancelled: while the gate is closed, probe every `probe_interval` seconds."""
        while True:
            await self._closed.wait()
            while not self.available:
                await asyncio.sleep(self.probe_interval)
                await self.probe()

    async def probe(self) -> bool:
        """One probe now; opens the gate when it succeeds."""
        self.probes += 1
        try:
            await self._probe()
        except SlurmError as error:
            log.debug("Slurm probe failed: %s", error)
            return False
        except Exception:  # the prober must outlive any one bad probe
            log.exception("the Slurm probe failed unexpectedly")
            return False
        if not self.available:
            self._open_gate()
        return True

    def _check(self, error: SlurmError) -> "asyncio.Task[bool]":
        if self._checking is None or self._checking.done():
            self._checking = asyncio.create_task(self._probe_after(error), name="Slurm health probe")
        return self._checking

    async def _probe_after(self, error: SlurmError) -> bool:
        if await self.probe():
            return True
        self._close(outage_reason(error))
        return False

    def _close(self, reason: str) -> None:
        if not self.available:
            return
        self.available = False
        self.reason = reason
        self.down_since = time.time()
        self.outages += 1
        self._open.clear()
        self._closed.set()
        if self.observer is not None:
            self.observer(False)
        log.warning(
            "Slurm is unavailable; requests wait for it (probing every %g s): %s", self.probe_interval, reason
        )

    def _open_gate(self) -> None:
        away = time.time() - (self.down_since or time.time())
        log.warning("Slurm answers again after %.1f s; waking what waited for it", away)
        self.available = True
        self.reason = ""
        self.down_since = None
        self._closed.clear()
        self._open.set()
        if self.observer is not None:
            self.observer(True)
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:  # one listener must not keep the others from hearing it
                log.exception("a Slurm recovery listener failed")
