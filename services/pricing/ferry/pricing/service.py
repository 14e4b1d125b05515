"""The pricing service: ingests price feeds (AWS spot price history JSON, catalog CSVs, an on-prem
cost YAML: see ferry.common.pricefeeds), keeps the latest price per zone, instance type and market in KV
(`ferry_prices`, read by the API and the scheduler) and publishes a price event for every change.
Feeds are files named by FERRY_PRICE_FEEDS (comma-separated); a file that changes is read again.
A malformed feed is refused with the file and the line or field named, and the last good prices stay.
"""

import asyncio
import contextlib
import logging
import re
from pathlib import Path

from ferry.common import wire
from ferry.common.errors import FerryError
from ferry.common.models import Event, PriceRecord
from ferry.common.pricefeeds import PriceBook, PricePoint, load_feed
from ferry.common.service import Service, service_main

log = logging.getLogger(__name__)
_KEY_SAFE = re.compile(r"[^A-Za-z0-9_-]")


def price_key(p: PricePoint) -> str:
    return ".".join(_KEY_SAFE.sub("_", part) or "_" for part in (p.zone, p.instance_type, p.market))


def to_record(p: PricePoint) -> PriceRecord:
    return PriceRecord(zone=p.zone, region=p.region, instance_type=p.instance_type, market=p.market,
                       price_per_hour=p.price_per_hour, timestamp=p.timestamp, source=p.source)


class Pricing(Service):
    """Keeps current prices from the configured feeds and publishes price events."""

    name = "pricing"

    async def start(self) -> None:
        await self.connect()
        self.book = PriceBook()
        self.seen: dict[Path, float] = {}

    def feed_paths(self) -> list[Path]:
        return list(self.settings.price_feeds)

    async def run(self) -> None:
        while not self.stopping.is_set():
            for path in self.feed_paths():
                await self.ingest(path)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.settings.price_poll_s)

    async def ingest(self, path: Path) -> None:
        assert self.bus is not None
        try:
            mtime = path.stat().st_mtime
        except OSError as exc:
            if self.seen.get(path) != -1.0:
                log.error("price feed %s: %s", path, exc.strerror)
                self.seen[path] = -1.0
            return
        if self.seen.get(path) == mtime:
            return
        self.seen[path] = mtime
        try:
            points = await asyncio.to_thread(load_feed, path)
        except FerryError as exc:
            log.error("price feed refused: %s", exc)
            await self.bus.publish(wire.cluster_event_subject("price_feed_error"),
                                   Event(kind="price_feed_error", message=str(exc)))
            return
        changed = self.book.add(points)
        for p in changed:
            record = to_record(p)
            old = await self.bus.prices.get(price_key(p))
            if old is not None and old.timestamp <= p.timestamp and old.price_per_hour != p.price_per_hour:
                record = record.model_copy(update={"previous_price_per_hour": old.price_per_hour,
                                                   "previous_timestamp": old.timestamp})
            await self.bus.prices.put(price_key(p), record)
            await self.bus.publish(wire.cluster_event_subject("price", price_key(p)),
                                   Event(kind="price", message=f"{p.zone} {p.instance_type} {p.market}: "
                                                              f"{p.price_per_hour:.4f}/h",
                                         data=record.model_dump()))
        log.info("price feed %s: %d points, %d changes", path, len(points), len(changed))


def main() -> None:
    service_main(Pricing)


if __name__ == "__main__":
    main()
