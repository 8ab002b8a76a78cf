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
