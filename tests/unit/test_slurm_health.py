"""The Slurm-health gate (clients/slurm_health.py) and the client's use of it, without Slurm."""

import asyncio
from pathlib import Path

import httpx
import pytest

from clients.slurm_client import SlurmClient
from clients.slurm_errors import SlurmAuthError, SlurmRejected, SlurmUnavailable
from clients.slurm_health import SlurmHealth

DOWN = SlurmUnavailable("no answer from slurmrestd (ConnectError)", operation="GET /jobs/state/")


class Probe:
    """A probe that fails while `away`, counting its calls."""

    def __init__(self, away: bool) -> None:
        self.away = away
        self.calls = 0
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()

    async def __call__(self) -> None:
        self.calls += 1
        self.entered.set()
        await self.release.wait()
        if self.away:
            raise SlurmUnavailable("no controller responds", operation="GET /ping/")


async def test_a_confirmed_failure_closes_the_gate_with_one_probe_for_many_callers() -> None:
    probe = Probe(away=True)
    probe.release.clear()
    health = SlurmHealth(probe)
    callers = [asyncio.create_task(health.confirm(DOWN)) for _ in range(50)]
    await probe.entered.wait()
    probe.release.set()
    assert all(await asyncio.gather(*callers))
    assert probe.calls == 1
    assert not health.available
    assert health.outages == 1
    refused = health.refusal("POST /job/submit")
    assert isinstance(refused, SlurmUnavailable)
    assert "ConnectError" in str(refused)
    # Closed: further callers are answered without another probe.
    assert await health.confirm(DOWN)
    assert probe.calls == 1


async def test_a_failure_the_probe_does_not_confirm_leaves_the_gate_open() -> None:
    probe = Probe(away=False)
    health = SlurmHealth(probe)
    assert not await health.confirm(DOWN)
    assert health.available
    assert health.refusal("GET /job/{}") is None
    # A refusal of the request itself is not Slurm being away: no probe at all.
    assert not await health.confirm(SlurmRejected("unknown partition", operation="POST /job/submit"))
    assert probe.calls == 1


async def test_the_prober_reopens_the_gate_and_tells_listeners() -> None:
    probe = Probe(away=True)
    health = SlurmHealth(probe, probe_interval=0.01)
    heard: list[bool] = []
    recovered = asyncio.Event()
    health.on_recovery(recovered.set)
    health.observer = heard.append
    prober = asyncio.create_task(health.run())
    try:
        assert await health.confirm(DOWN)
        assert not await health.wait_available(0.05)  # still away: probing
        probe.away = False
        await asyncio.wait_for(recovered.wait(), 5)
        assert health.available
        assert await health.wait_available(0)
        assert health.reason == ""
        assert heard == [False, True]
        assert probe.calls >= 3  # the confirming probe, at least one failed retry, the one that worked
    finally:
        prober.cancel()


async def test_a_refused_token_is_named_as_such_and_the_token_never_appears(tmp_path: Path) -> None:
    health = SlurmHealth(Probe(away=True))
    refused = SlurmAuthError("Protocol authentication error [1007]", operation="GET /jobs/state/", status=511)
    assert await health.confirm(refused)
    assert "token" in health.reason
    assert "SLURM_JWT_FILE" in health.reason
    assert "1007" in health.reason


async def test_the_client_sends_nothing_while_the_gate_is_closed_and_reports_failures(tmp_path: Path) -> None:
    sent: list[str] = []
    slurm_up = False

    def slurmrestd(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        if request.url.path.endswith("/ping/"):
            ping = {"hostname": "ctld", "pinged": "UP" if slurm_up else "DOWN", "responding": slurm_up}
            return httpx.Response(200, json={"pings": [ping]})
        if slurm_up:
            return httpx.Response(200, json={"jobs": [], "errors": [], "warnings": []})
        return httpx.Response(502, json={"errors": [{"error_number": 1800, "error": "Communication error"}]})

    token = tmp_path / "jwt"
    token.write_text("secret-token-value")
    async with SlurmClient(
        "http://slurmrestd", user_name="slurm", token_file=token, transport=httpx.MockTransport(slurmrestd)
    ) as slurm:
        health = SlurmHealth(slurm.probe)
        slurm.gate = health
        with pytest.raises(SlurmUnavailable) as failed:
            await slurm.job_states([1])
        # The failure started a probe (the ping says no controller responds); confirm joins it.
        assert await health.confirm(failed.value)
        assert sent == ["/slurm/v0.0.44/jobs/state/", "/slurm/v0.0.44/ping/"]
        assert "Communication error" in health.reason
        with pytest.raises(SlurmUnavailable, match="not sent"):
            await slurm.get_job(7)
        assert len(sent) == 2  # refused without a request
        # The probe itself is sent while closed; a responding controller opens the gate.
        slurm_up = True
        assert await health.probe()
        assert health.available
        assert await slurm.job_states([1]) == {}
        assert sent[2:] == ["/slurm/v0.0.44/ping/", "/slurm/v0.0.44/jobs/state/"]
