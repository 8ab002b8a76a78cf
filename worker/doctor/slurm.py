"""The doctor's Slurm checks: the token file, slurmrestd, the token being accepted (`ping`,
`diag`), slurmctld answering, the default partition, the MCS label, reading nodes and the
operator rights node sync needs (probed on a node that does not exist, so nothing changes).

Every request goes through SlurmClient, the one way to Slurm (its token handling, API
version and error classes); only `diag` is read raw, since its wording needs the answer's
own status and error numbers.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from pathlib import Path
from typing import Any

from bridge.slurm_api.v0044 import V0044UpdateNodeMsg
from clients.slurm_client import SlurmClient
from clients.slurm_errors import SlurmAuthError, SlurmError, SlurmNotFound
from worker.doctor.check import TIMEOUT, Check
from worker.settings import WorkerSettings


async def slurm_checks(settings: WorkerSettings) -> list[Check]:
    area = "Slurm"
    s = settings
    token_check, token = _token_check(s.slurm_jwt_file)
    checks = [token_check]
    if token is None:
        return checks
    async with SlurmClient(
        s.slurm_rest_url,
        user_name=s.slurm_user_name,
        token_file=s.slurm_jwt_file,
        timeout=TIMEOUT,
        api_version=s.slurm_api_version,
    ) as slurm:
        try:
            pings = await slurm.ping()
        except SlurmError as error:
            checks.append(
                Check(
                    area,
                    "slurmrestd",
                    "fail",
                    f"no answer at {s.slurm_rest_url}: {error.message}",
                    "check SLURM_REST_URL (--slurm-rest-url) and that slurmrestd runs",
                )
            )
            return checks
        checks.append(Check(area, "slurmrestd", "ok", f"answers at {s.slurm_rest_url}"))
        diag = await _diag(slurm, s.slurm_user_name)
        checks.append(diag)
        if diag.status == "fail":
            return checks
        responding = [p.hostname or "?" for p in pings if p.responding]
        if responding:
            checks.append(Check(area, "slurmctld", "ok", f"responding: {', '.join(responding)}"))
        else:
            checks.append(
                Check(
                    area,
                    "slurmctld",
                    "fail",
                    "no controller answers ping",
                    "start slurmctld (scontrol ping)",
                )
            )
        checks.append(await _partition_check(slurm, s.partition))
        checks.append(_mcs_check(s.mcs_label))
        checks += await _node_checks(slurm, s.slurm_user_name)
    return checks


async def _diag(slurm: SlurmClient, user_name: str | None) -> Check:
    """`GET /diag/` needs an accepted token (ping answers 200 either way)."""
    try:
        answer = await slurm.get_raw("/diag/")
    except SlurmError as error:  # no answer at all ("no answer (ConnectError)")
        return Check("Slurm", "token", "fail", f"GET /diag/: {error.message}")
    # The body may be anything a proxy or a failing slurmrestd sends: only what has the
    # expected shape is read, so a bad answer is a failed check, never a traceback.
    data = answer.data or {}
    raw_errors = data.get("errors")
    errors = [e for e in (raw_errors if isinstance(raw_errors, list) else []) if isinstance(e, dict)]
    numbers = {e.get("error_number") for e in errors}
    message = "; ".join(str(e.get("error") or e.get("description")) for e in errors) or answer.reason
    if answer.status in (401, 403, 511) or 1007 in numbers:
        user = f" for user {user_name}" if user_name else ""
        return Check(
            "Slurm",
            "token",
            "fail",
            f"slurmrestd refused the token{user}: HTTP {answer.status} {message}",
            "renew the token in SLURM_JWT_FILE (--slurm-jwt-file), e.g. `scontrol token username=slurm "
            "lifespan=...` into the Secret (Helm: slurm.jwtSecret); SLURM_USER_NAME must be the token's "
            "user unless it is SlurmUser's; slurm.conf needs AuthAltTypes=auth/jwt",
        )
    if answer.status != 200 or errors:
        return Check(
            "Slurm",
            "token",
            "fail",
            f"GET /diag/: HTTP {answer.status} {message}",
            "slurmctld did not answer slurmrestd: check slurmctld (scontrol ping) and its log",
        )
    meta = data.get("meta")
    slurm_meta = meta.get("slurm") if isinstance(meta, dict) else None
    release = slurm_meta.get("release", "?") if isinstance(slurm_meta, dict) else "?"
    stats = data.get("statistics")
    started = stats.get("jobs_started") if isinstance(stats, dict) else None
    if not isinstance(started, int) or isinstance(started, bool):
        # The job watcher probes pending jobs when this count moves (worker/job_watcher.py).
        return Check(
            "Slurm",
            "token",
            "warn",
            f"accepted (diag answered, Slurm {release}), but with no statistics.jobs_started: the job "
            "watcher will ask for every pending job's state on every pass",
            "the count is sdiag's 'Jobs started'; a slurmrestd whose /diag/ answer carries it keeps "
            "the watcher's probes to the passes after Slurm started a job",
        )
    return Check("Slurm", "token", "ok", f"accepted (diag answered, Slurm {release})")


def _token_check(path: Path) -> tuple[Check, str | None]:
    fix = (
        "SLURM_JWT_FILE (--slurm-jwt-file) must name a readable file holding the Slurm JWT "
        "(Helm: slurm.jwtSecret, mounted at /var/run/secrets/slurm/auth-token)"
    )
    try:
        token = path.read_text(encoding="utf-8").strip().removeprefix("SLURM_JWT=").strip()
    except OSError as error:
        return Check("Slurm", "token file", "fail", f"cannot read {path}: {error.strerror}", fix), None
    if not token:
        return Check("Slurm", "token file", "fail", f"{path} is empty", fix), None
    claims = _jwt_claims(token)
    if claims is None:
        return Check("Slurm", "token file", "warn", f"{path} does not hold a JWT; slurmrestd decides"), token
    user = claims.get("sun") or "?"
    expires = claims.get("exp")
    if not isinstance(expires, int | float):
        return Check("Slurm", "token file", "ok", f"{path}: token for {user}, no expiry"), token
    left = expires - time.time()
    renew = (
        f"renew it: scontrol token username={user} lifespan=SECONDS, into the file of SLURM_JWT_FILE "
        "(the next request reads it, no restart needed)"
    )
    if left <= 0:
        return Check("Slurm", "token file", "fail", f"{path}: the token of {user} has expired", renew), token
    days = left / 86400
    if days < 1:
        return Check(
            "Slurm", "token file", "warn", f"{path}: token for {user} expires in {left / 3600:.1f} h", renew
        ), token
    return Check("Slurm", "token file", "ok", f"{path}: token for {user}, expires in {days:.0f} days"), token


def _jwt_claims(token: str) -> dict[str, Any] | None:
    """The payload of a JWT, unverified (only slurmctld can verify it): for `sun` and `exp`."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None


async def _partition_check(slurm: SlurmClient, name: str) -> Check:
    try:
        partition = await slurm.get_partition(name)
    except SlurmError as error:
        return Check("Slurm", "partition", "fail", f"cannot read partition {name}: {error}")
    if partition is None:
        return Check(
            "Slurm",
            "partition",
            "fail",
            f"no partition {name}",
            "set SLURM_PARTITION (--partition) to an existing partition, or create it in slurm.conf "
            "(e.g. a NodeSet of Feature=slurm-bridge)",
        )
    states = list((partition.partition.state if partition.partition else None) or [])
    nodes = (partition.nodes.configured if partition.nodes else None) or ""
    if not nodes:
        return Check(
            "Slurm",
            "partition",
            "warn",
            f"{name} has no nodes yet: jobs stay pending until nodes join it",
            "label Kubernetes nodes scheduler.slinky.slurm.net/external-node (node sync registers them), "
            "or add Slurm nodes to the partition",
        )
    if states and "UP" not in states:
        return Check(
            "Slurm",
            "partition",
            "warn",
            f"{name} is {','.join(states)} ({nodes}): jobs stay pending",
            f"scontrol update PartitionName={name} State=UP",
        )
    return Check("Slurm", "partition", "ok", f"{name} ({nodes})")


def _mcs_check(label: str) -> Check:
    if not label:
        return Check(
            "Slurm",
            "MCS label",
            "warn",
            "jobs carry no MCS label, so MCSPlugin=mcs/label cannot keep batch jobs off the nodes of pods",
            "set MCS_LABEL (--mcs-label), for example kubernetes (Helm: slurm.mcsLabel)",
        )
    if any(c.isspace() or c in ",'\"" for c in label):
        return Check(
            "Slurm",
            "MCS label",
            "fail",
            f"{label!r} has spaces, commas or quotes",
            "set MCS_LABEL (--mcs-label) to one word",
        )
    return Check(
        "Slurm",
        "MCS label",
        "ok",
        f"jobs are labelled {label} (isolation needs MCSPlugin=mcs/label in slurm.conf, "
        "which slurmrestd does not show)",
    )


async def _node_checks(slurm: SlurmClient, user_name: str | None) -> list[Check]:
    try:
        nodes = await slurm.list_nodes()
    except SlurmError as error:
        return [Check("Slurm", "nodes", "fail", f"cannot read nodes: {error}")]
    checks = [Check("Slurm", "nodes", "ok", f"may read nodes ({len(nodes)})")]
    # An update of a node that does not exist: slurmctld checks the caller's
    # rights first (2010 "Invalid user id" for a plain user), then the name
    # (2018 "Invalid node name specified"). Nothing is changed either way.
    probe = f"slurm-bridge-doctor-{secrets.token_hex(4)}"
    who = f"user {user_name}" if user_name else "the token's user"
    try:
        await slurm.update_node(probe, V0044UpdateNodeMsg())
    except SlurmNotFound:
        checks.append(Check("Slurm", "operator rights", "ok", f"{who} may update nodes (node sync)"))
        return checks
    except SlurmAuthError as error:
        checks.append(Check("Slurm", "operator rights", "fail", f"refused: {error.message}"))
        return checks
    except SlurmError as error:
        if 2010 in error.error_numbers:
            checks.append(
                Check(
                    "Slurm",
                    "operator rights",
                    "fail",
                    f"{who} may not update nodes: node sync cannot drain, register or remove nodes",
                    "use a token of SlurmUser (scontrol token username=slurm) in SLURM_JWT_FILE, with "
                    "SLURM_USER_NAME the user jobs run as, or make the user an operator (sacctmgr ... "
                    "AdminLevel=Operator)",
                )
            )
        else:
            checks.append(Check("Slurm", "operator rights", "warn", f"could not tell: {error}"))
        return checks
    checks.append(Check("Slurm", "operator rights", "warn", f"updating the absent node {probe} succeeded?"))
    return checks
