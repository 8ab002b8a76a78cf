"""A daemon thread that reacts to store changes: what the simulated kubelet and controllers share."""

from __future__ import annotations

import abc
import threading

from .store import Store


class StoreLoop(abc.ABC):
    def __init__(self, store: Store, name: str) -> None:
        self.store = store
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self.store.cond:
            self._stop = True
            self.store.cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    @abc.abstractmethod
    def _run(self) -> None:
        """The loop; it ends once `_stop` is set (under the store's condition)."""
