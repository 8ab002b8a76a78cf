"""testbed/waiting.py: the one polling helper returns what it found, and a timeout says what it waited for."""

import asyncio
from collections.abc import Iterator

import pytest

from testbed.waiting import ConditionTimeout, until, wait_until


def test_wait_until_returns_the_first_truthy_answer() -> None:
    answers: Iterator[dict[str, int] | None] = iter([None, {}, {"found": 1}, {"later": 2}])
    assert wait_until(lambda: next(answers), "an answer", timeout=1, interval=0) == {"found": 1}


def test_a_timeout_names_what_was_awaited_and_is_a_test_failure_and_a_timeout() -> None:
    with pytest.raises(ConditionTimeout, match=r"timed out after 0.05 s waiting for the moon") as raised:
        wait_until(lambda: False, "the moon", timeout=0.05, interval=0.01)
    assert isinstance(raised.value, AssertionError)
    assert isinstance(raised.value, TimeoutError)


def test_what_may_say_what_was_last_seen() -> None:
    seen: list[int] = []

    def check() -> bool:
        seen.append(len(seen))
        return False

    with pytest.raises(ConditionTimeout, match=r"waiting for three \(last seen: \d+\)"):
        wait_until(check, lambda: f"three (last seen: {seen[-1]})", timeout=0.05, interval=0.01)


def test_an_exception_ends_the_wait_unless_it_is_ignored() -> None:
    def refused() -> bool:
        raise ConnectionRefusedError("not listening yet")

    with pytest.raises(ConnectionRefusedError):
        wait_until(refused, "a listener", timeout=5)
    with pytest.raises(ConditionTimeout, match="the last check raised ConnectionRefusedError") as raised:
        wait_until(refused, "a listener", timeout=0.05, interval=0.01, ignoring=OSError)
    assert isinstance(raised.value.__cause__, ConnectionRefusedError)

    tries = iter([OSError("not yet"), OSError("not yet"), None])

    def comes_up() -> str:
        error = next(tries)
        if error is not None:
            raise error
        return "up"

    assert wait_until(comes_up, "a listener", timeout=1, interval=0, ignoring=OSError) == "up"


async def test_until_takes_a_plain_or_an_async_check() -> None:
    count = 0

    async def third_time() -> int | None:
        nonlocal count
        count += 1
        return count if count == 3 else None

    assert await until(third_time, "the third try", timeout=1, interval=0) == 3
    assert await until(lambda: "plain", "a plain answer", timeout=1) == "plain"
    assert await until(lambda: asyncio.to_thread(lambda: 7), "an answer from a thread", timeout=1) == 7
    with pytest.raises(ConditionTimeout, match="waiting for never"):
        await until(third_time, "never", timeout=0.05, interval=0.01)
