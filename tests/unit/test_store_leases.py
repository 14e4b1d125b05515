"""Store leases: renewed from one thread per ``Leases`` while held, deleted once let go."""

import threading
import time
from pathlib import Path

from ferry.store.leases import GC_KEY, WRITERS_PREFIX, Lease, Leases
from ferry.store.local import LocalBackend


def _renewed(backend: LocalBackend, key: str) -> float:
    return Lease.model_validate_json(backend.get(key)).renewed


def _renewers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "store leases"]


def test_held_leases_are_renewed_by_one_thread_and_deleted_when_let_go(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "store")
    leases = Leases(backend, ttl=0.4)
    before = len(_renewers())
    with leases.writing(timeout=1), leases.writing(timeout=1):
        keys = list(backend.list(WRITERS_PREFIX))
        assert len(keys) == 2
        first = {k: _renewed(backend, k) for k in keys}
        time.sleep(0.5)  # past the ttl: only a renewal keeps them fresh
        assert all(_renewed(backend, k) > first[k] for k in keys)
        assert all(time.time() - _renewed(backend, k) < 0.4 for k in keys)
        assert len(_renewers()) == before + 1  # one thread for both
    assert list(backend.list(WRITERS_PREFIX)) == []
    time.sleep(0.3)  # a renewal round after the release must not put them back
    assert list(backend.list("locks/")) == []
    assert len(_renewers()) == before  # it ends once it holds nothing


def test_a_lease_let_go_is_not_put_back_while_another_is_held(tmp_path: Path) -> None:
    backend = LocalBackend(tmp_path / "store")
    leases = Leases(backend, ttl=0.2)
    with leases.writing(timeout=1):
        (held,) = backend.list(WRITERS_PREFIX)
        for _ in range(20):  # short writes come and go while one lease is renewed
            with leases.writing(timeout=1):
                time.sleep(0.01)
        time.sleep(0.1)  # renewal rounds since the last one was let go
        assert list(backend.list(WRITERS_PREFIX)) == [held]
        assert time.time() - _renewed(backend, held) < 0.2
    assert list(backend.list("locks/")) == []
    assert not backend.exists(GC_KEY)
