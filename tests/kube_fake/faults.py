"""Request log and fault injection (thread-safe; rules are consumed in order)."""

from __future__ import annotations

import json
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


class Faults:
    def __init__(self, cond: threading.Condition) -> None:
        # Shares the store's condition so ``wait_for`` can also wait on requests.
        self._cond = cond
        self._rules: list[_Rule] = []
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

    def take(self, method: str, path: str) -> tuple[float, errors.ApiError | None]:
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
        return delay, error

    def sleep(self, seconds: float) -> None:
        """A delay that server shutdown interrupts."""
        self._cancel.wait(seconds)

    def cancel(self) -> None:
        self._cancel.set()
