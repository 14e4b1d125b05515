"""Leases that keep garbage collection from deleting chunks an unfinished checkpoint relies on.

A writer may skip uploading a chunk because it already exists, yet that chunk may be referenced by
no committed manifest (its checkpoints were deleted): gc would see an orphan. So writers and gc
coordinate through small objects, each first *creating* its own lease and only then *looking* for
the other's (with a strongly consistent backend, one of any two always sees the other):

* a writer puts ``locks/writers/<uuid>.json``, then looks for ``locks/gc.json``; while a fresh gc
  lease exists it removes its own lease, waits and tries again;
* gc puts ``locks/gc.json``, then waits until no fresh writer lease remains (writers already past
  their check finish and commit their manifests) or gives up and defers.

Both sides renew their lease every ``ttl / 4`` seconds from a background thread; a lease whose
``renewed`` time is older than ``ttl`` belongs to a crashed process and is ignored. This assumes the
nodes' clocks agree to well within ``ttl``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import BaseModel, ValidationError

from ferry.store.backend import Backend
from ferry.store.errors import BackendUnavailable, ObjectNotFound

log = logging.getLogger(__name__)

WRITERS_PREFIX = "locks/writers/"
GC_KEY = "locks/gc.json"
DEFAULT_TTL = 60.0
_POLL = 0.1


class Lease(BaseModel):
    owner: str
    renewed: float


class Leases:
    """Lease handling for one backend."""

    def __init__(self, backend: Backend, *, ttl: float = DEFAULT_TTL) -> None:
        self.backend = backend
        self.ttl = ttl
        self.owner = f"{socket.gethostname()}:{os.getpid()}"

    def _put(self, key: str) -> None:
        self.backend.put(key, Lease(owner=self.owner, renewed=time.time()).model_dump_json().encode())

    def _fresh(self, key: str) -> bool:
        try:
            lease = Lease.model_validate_json(self.backend.get(key))
        except ObjectNotFound:
            return False
        except ValidationError:
            log.warning("ignoring unreadable lease %s", key)
            return False
        return time.time() - lease.renewed < self.ttl

    def _writers_active(self) -> bool:
        return any(self._fresh(key) for key in self.backend.list(WRITERS_PREFIX))

    @contextmanager
    def _renewing(self, key: str) -> Iterator[None]:
        stop = threading.Event()

        def renew() -> None:
            while not stop.wait(self.ttl / 4):
                try:
                    self._put(key)
                except Exception:  # the next round tries again; a lease left stale is merely ignored
                    log.warning("cannot renew lease %s", key, exc_info=True)

        thread = threading.Thread(target=renew, name=f"lease {key}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            self.backend.delete(key)

    @contextmanager
    def writing(self, timeout: float) -> Iterator[None]:
        """Hold a writer lease; wait (up to ``timeout`` seconds) while a gc holds the store."""
        key = f"{WRITERS_PREFIX}{uuid.uuid4().hex}.json"
        deadline = time.monotonic() + timeout
        while True:
            self._put(key)
            if not self._fresh(GC_KEY):
                break
            self.backend.delete(key)
            if time.monotonic() > deadline:
                raise BackendUnavailable(
                    f"{self.backend.describe()}: a garbage collection has held the store for over "
                    f"{timeout:.0f} s; try again later (or delete {GC_KEY} if no gc runs)"
                )
            time.sleep(_POLL)
        with self._renewing(key):
            yield

    @contextmanager
    def collecting(self, drain_timeout: float) -> Iterator[bool]:
        """Hold the gc lease; yields True once no writer is active, False if they did not finish in time."""
        self._put(GC_KEY)
        with self._renewing(GC_KEY):
            deadline = time.monotonic() + drain_timeout
            while self._writers_active():
                if time.monotonic() > deadline:
                    yield False
                    return
                time.sleep(_POLL)
            yield True
