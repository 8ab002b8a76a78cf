"""The tenant policy file (bridge/policy.py): read at start, re-read when it changes.

The worker and the webhook mount the same ConfigMap; each replica reads it here, so a
policy edit reaches both without a restart.
"""

import logging
import os
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator

from bridge.policy import PolicyError, PolicySet, parse_policy

log = logging.getLogger(__name__)


def load_policy(path: Path) -> PolicySet:
    try:
        text = path.read_text()
    except OSError as error:
        raise PolicyError(f"cannot read {path}: {error.strerror}") from None
    return parse_policy(text, str(path))


class PolicyFile:
    """The policy in a file, re-read when it changes (mtime, size or inode: a ConfigMap update).

    No path: no restrictions. The file must be valid at start (PolicyError);
    a later invalid version is logged and the last valid one stays in force.
    A file missing at start means no restrictions (with a warning); one that
    disappears later leaves the last policy in force.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._policy = PolicySet()
        if path is not None:
            self._stamp = self._stat()
            if self._stamp is None:
                log.warning("tenant policy file %s does not exist: no tenant restrictions", path)
            else:
                self._policy = load_policy(path)

    def _stat(self) -> tuple[int, int, int] | None:
        assert self.path is not None
        try:
            status = os.stat(self.path)
        except FileNotFoundError:
            return None
        return status.st_mtime_ns, status.st_size, status.st_ino

    def current(self) -> PolicySet:
        """The policy in force now (a stat per call; the file is read only when it changed)."""
        if self.path is None:
            return self._policy
        stamp = self._stat()
        if stamp == self._stamp:
            return self._policy
        self._stamp = stamp
        if stamp is None:
            # Mid-run a vanished file is more likely a mistake than a decision: fail closed.
            log.warning("tenant policy file %s is gone: the previous policy stays in force", self.path)
            return self._policy
        try:
            self._policy = load_policy(self.path)
        except PolicyError as error:
            log.error("tenant policy not reloaded, the previous one stays in force: %s", error)
        else:
            log.info("tenant policy reloaded from %s", self.path)
        return self._policy


def _empty_is_unset(value: object) -> object:
    return None if value == "" else value  # the Helm chart renders every setting; empty = not used


def _valid_policy_file(value: Path | None) -> Path | None:
    if value is not None and value.exists():
        try:
            load_policy(value)
        except PolicyError as error:
            raise ValueError(str(error)) from None
    return value


# The type of a TENANT_POLICY_FILE setting (worker and webhook): empty is unset, and a file that
# exists at start must be a valid policy (a one-line setting error otherwise).
PolicyPath = Annotated[Path | None, BeforeValidator(_empty_is_unset), AfterValidator(_valid_policy_file)]
