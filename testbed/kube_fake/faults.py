"""Request log and fault injection (thread-safe; rules are consumed in order)."""

from __future__ import annotations

import json
import random
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from . import errors


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any  # parsed JSON, raw text if not JSON, None if empty


@dataclass
class _Rule:
    method: str
    pattern: re.Pattern[str]
    remaining: int
    status: int | None = None
    reason: str | None = None
    message: str | None = None
    retry_after: int | None = None
    delay: float = 0.0
    hits: list[RecordedRequest] = field(default_factory=list)

    def matches(self, method: str, path: str) -> bool:
        return self.remaining > 0 and self.method in ("*", method) and bool(self.pattern.search(path))


class Hold:
    """One request parked by ``Faults.hold_next`` until the test releases or drops it.

    ``applied=False``: parked before it reaches the store (``drop()`` means it never happens).
    ``applied=True``: the change is made, the answer is parked (the client does not know yet).
    """

    def __init__(
        self,
        cond: threading.Condition,
        method: str,
        pattern: re.Pattern[str],
        body: str | None,
        applied: bool,
    ) -> None:
        self._cond = cond
        self.method = method
        self.pattern = pattern
        self.body = body
        self.applied = applied
        self.request: RecordedRequest | None = None  # the parked request, once one arrived
        self._outcome: str | None = None  # "release" or "drop"

    def matches(self, method: str, path: str, raw: bytes) -> bool:
        return (
            self.request is None
            and self.method in ("*", method)
            and bool(self.pattern.search(path))
            and (self.body is None or self.body in raw.decode("utf-8", "replace"))
        )

    @property
    def arrived(self) -> bool:
        with self._cond:
            return self.request is not None

    def release(self) -> None:
        """Let the parked request go on: applied (if it was not yet) and answered."""
        self._decide("release")

    def drop(self) -> None:
        """Close the parked request's connection without an answer (and without applying it, if not yet)."""
        self._decide("drop")

    def _decide(self, outcome: str) -> None:
        with self._cond:
            self._outcome = outcome
            self._cond.notify_all()

    def park(self, cancelled: threading.Event) -> bool:
        """Block the handler thread until decided (or server shutdown); True to go on."""
        with self._cond:
            while self._outcome is None and not cancelled.is_set():
                self._cond.wait(0.1)
            return self._outcome == "release"


@dataclass
class _RandomRule:
    """Fail a fraction of the matching requests, with a status drawn from ``statuses``, until removed."""

    method: str
    pattern: re.Pattern[str]
    statuses: tuple[int, ...]
    fraction: float
    rng: random.Random
    watches: bool
    injected: dict[int, int] = field(default_factory=dict)  # status -> count

    def matches(self, method: str, path: str, watch: bool) -> bool:
        return (
            (self.watches or not watch) and self.method in ("*", method) and bool(self.pattern.search(path))
        )


class Faults:
    def __init__(self, cond: threading.Condition) -> None:
        # Shares the store's condition so ``wait_for`` can also wait on requests.
        self._cond = cond
        self._rules: list[_Rule] = []
        self._holds: list[Hold] = []
        self._random: list[_RandomRule] = []
        self._log: list[RecordedRequest] = []
        self._cancel = threading.Event()

    def record(
        self, method: str, path: str, query: dict[str, str], content_type: str, raw: bytes
    ) -> RecordedRequest:
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
        req = RecordedRequest(method, path, query, content_type, body)
        with self._cond:
            self._log.append(req)
            self._cond.notify_all()
        return req

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._cond:
            return list(self._log)

    def clear(self) -> None:
        with self._cond:
            self._log.clear()

    def add(self, rule: _Rule) -> None:
        with self._cond:
            self._rules.append(rule)

    def fail_next(
        self,
        method: str,
        path_regex: str,
        status: int,
        count: int = 1,
        reason: str | None = None,
        message: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        self.add(_Rule(method.upper(), re.compile(path_regex), count, status, reason, message, retry_after))

    def delay_next(self, method: str, path_regex: str, seconds: float, count: int = 1) -> None:
        self.add(_Rule(method.upper(), re.compile(path_regex), count, delay=seconds))

    def clear_rules(self) -> None:
        """Forget every fault not yet used up: the API server is healthy again."""
        with self._cond:
            self._rules.clear()

    def hold_next(self, method: str, path_regex: str, *, body: str | None = None, applied: bool) -> Hold:
        hold = Hold(self._cond, method.upper(), re.compile(path_regex), body, applied)
        with self._cond:
            self._holds.append(hold)
        return hold

    def take_hold(self, method: str, path: str, raw: bytes, request: RecordedRequest) -> Hold | None:
        """The first armed hold this request matches, now holding it (each hold takes one request)."""
        with self._cond:
            for hold in self._holds:
                if hold.matches(method, path, raw):
                    hold.request = request
                    self._holds.remove(hold)
                    self._cond.notify_all()
                    return hold
        return None

    def disarm(self, hold: Hold) -> None:
        """A hold no longer wanted: unarmed if nothing arrived, else its request goes on."""
        with self._cond:
            if hold in self._holds:
                self._holds.remove(hold)
        if hold.arrived:
            hold.release()

    def park(self, hold: Hold) -> bool:
        return hold.park(self._cancel)

    def fail_randomly(
        self,
        method: str,
        path_regex: str,
        statuses: tuple[int, ...],
        fraction: float,
        *,
        seed: int | None = None,
        watches: bool = True,
    ) -> _RandomRule:
        if not statuses or not 0.0 <= fraction <= 1.0:
            raise ValueError("kube_fake: fail_randomly needs statuses and a fraction in [0, 1]")
        rule = _RandomRule(
            method.upper(), re.compile(path_regex), tuple(statuses), fraction, random.Random(seed), watches
        )
        with self._cond:
            self._random.append(rule)
        return rule

    def stop_random_failures(self) -> dict[int, int]:
        """Remove every random rule; returns how many answers of each status they injected."""
        with self._cond:
            totals = self.injected()
            self._random.clear()
        return totals

    def injected(self) -> dict[int, int]:
        """Answers injected so far by the random rules still in place, per status."""
        totals: dict[int, int] = {}
        with self._cond:
            for rule in self._random:
                for status, count in rule.injected.items():
                    totals[status] = totals.get(status, 0) + count
        return totals

    def take(self, method: str, path: str, *, watch: bool = False) -> tuple[float, errors.ApiError | None]:
        """Consume matching rules: total delay to apply and the error to answer, if any."""
        delay, error = 0.0, None
        with self._cond:
            for rule in self._rules:
                if not rule.matches(method, path):
                    continue
                if rule.status is None:
                    rule.remaining -= 1
                    delay += rule.delay
                elif error is None:
                    rule.remaining -= 1
                    error = errors.generic(rule.status, rule.reason, rule.message)
                    if rule.retry_after is not None:
                        error.headers["Retry-After"] = str(rule.retry_after)
                        assert error.details is not None
                        error.details["retryAfterSeconds"] = rule.retry_after
            self._rules = [r for r in self._rules if r.remaining > 0]
            for chance in self._random:
                if error is not None:
                    break
                if chance.matches(method, path, watch) and chance.rng.random() < chance.fraction:
                    status = chance.rng.choice(chance.statuses)
                    chance.injected[status] = chance.injected.get(status, 0) + 1
                    error = errors.generic(status)
                    if status == 429:  # as API Priority and Fairness answers
                        error.headers["Retry-After"] = "1"
        return delay, error

    def sleep(self, seconds: float) -> None:
        """A delay that server shutdown interrupts."""
        self._cancel.wait(seconds)

    def cancel(self) -> None:
        self._cancel.set()
