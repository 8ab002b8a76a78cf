"""The worker process hands its event loop's thread the GIL back sooner than Python's default."""

import sys
from pathlib import Path

import pytest

import worker.main as main
from worker.settings import load_settings


class Connecting(Exception):
    """Raised where the worker would connect to Temporal: far enough for this test."""


async def test_the_worker_process_shortens_the_gil_switch_interval(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    async def connect(*args: object, **kwargs: object) -> None:
        raise Connecting

    monkeypatch.setattr(main, "connect_temporal", connect)
    token = tmp_path / "jwt"
    token.write_text("x")
    before = sys.getswitchinterval()
    try:
        with pytest.raises(Connecting):
            await main.run_worker(load_settings(slurm_jwt_file=token))
        assert sys.getswitchinterval() == main.GIL_SWITCH_INTERVAL < before
    finally:
        sys.setswitchinterval(before)
