"""Running a list of blocking tasks on a thread pool, failing fast on the first error."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import TypeVar

T = TypeVar("T")


def run_all(tasks: Sequence[Callable[[], T]], workers: int) -> list[T]:
    """Results of ``tasks`` in order. On an error (or an interrupt), tasks not yet started are
    dropped, running ones finish, and the error of the earliest failed task is raised."""
    if workers <= 1 or len(tasks) <= 1:
        return [task() for task in tasks]
    pool = ThreadPoolExecutor(max_workers=min(workers, len(tasks)), thread_name_prefix="ferry-store")
    try:
        futures = [pool.submit(task) for task in tasks]
        wait(futures, return_when=FIRST_EXCEPTION)
        for future in futures:
            if future.done() and not future.cancelled() and (error := future.exception()) is not None:
                raise error
        return [future.result() for future in futures]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class Progress:
    """Adds up done bytes from any thread and reports ``(done, total)``, serialised and increasing."""

    def __init__(self, callback: Callable[[int, int], None] | None, total: int) -> None:
        self._callback = callback
        self._total = total
        self._done = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        if self._callback is None:
            return
        with self._lock:
            self._done += n
            self._callback(self._done, self._total)
