"""The pricing service: for now it only keeps the standard lifecycle; price feeds (spot price
history, catalog CSVs, on-prem costs) arrive with the control-plane work."""

import logging

from ferry.common.service import Service, service_main

log = logging.getLogger(__name__)


class Pricing(Service):
    """Answers price queries and publishes price events (no feeds configured yet)."""

    name = "pricing"

    async def start(self) -> None:
        await self.connect()

    async def run(self) -> None:
        await self.stopping.wait()


def main() -> None:
    service_main(Pricing)


if __name__ == "__main__":
    main()
