"""The store's thread pool helper and its progress counter."""

from __future__ import annotations

import threading
import time
from functools import partial

import pytest

from ferry.store.parallel import Progress, run_all


def _square(n: int) -> int:
    return n * n


def test_results_keep_their_order() -> None:
    assert run_all([partial(_square, n) for n in range(20)], 4) == [n * n for n in range(20)]
    assert run_all([partial(_square, n) for n in range(3)], 1) == [0, 1, 4]


def test_the_first_error_stops_the_rest() -> None:
    ran: list[int] = []

    def task(n: int) -> int:
        if n == 3:
            raise RuntimeError("boom")
        time.sleep(0.01)
        ran.append(n)
        return n

    with pytest.raises(RuntimeError, match="boom"):
        run_all([partial(task, n) for n in range(200)], 2)
    assert len(ran) < 50


def test_progress_is_serialised_and_increasing() -> None:
    seen: list[tuple[int, int]] = []
    progress = Progress(lambda done, total: seen.append((done, total)), 400)

    def add_many() -> None:
        for _ in range(100):
            progress.add(1)

    threads = [threading.Thread(target=add_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == [(n, 400) for n in range(1, 401)]
    Progress(None, 10).add(5)  # no callback: nothing to do
