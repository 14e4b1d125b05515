"""Price feeds parsed into `PricePoint`s, and the `PriceBook` that keeps the latest price per key.

Everything here is pure except `load_feed(path)`, which reads one file and hands its text to the
parser its extension (or, failing that, its content) names. Every parser refuses bad input with a
one-line `UsageError` that names the file and the line, item or key at fault.

Three feeds:

AWS spot price history (`aws ec2 describe-spot-price-history` output, `*.json`)::

    {"SpotPriceHistory": [
        {"AvailabilityZone": "us-east-1a", "InstanceType": "p3.2xlarge",
         "ProductDescription": "Linux/UNIX", "SpotPrice": "0.918000",
         "Timestamp": "2023-02-15T10:00:00+00:00"}, ...]}

    SpotPrice is a string in AWS's output; a JSON number is accepted too. Either must be a finite,
    non-negative decimal. Timestamp is ISO 8601 (a time without an offset is taken as UTC). The
    region is the zone without its trailing letter. Other top-level keys (NextToken) are ignored.

Catalog CSV (`*.csv`), header in any order but with exactly these columns::

    InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,SpotPrice,Region,AvailabilityZone

    Each row gives an on-demand point (Price) and, when SpotPrice is not empty, a spot point.
    InstanceType and Region are required; AcceleratorName, AcceleratorCount, vCPUs, MemoryGiB and
    AvailabilityZone may be empty. A row without Price must have a SpotPrice (spot-only offers).
    A row without AvailabilityZone prices the whole region: its points carry the region's name as
    their zone. Catalogs carry no time: their points have timestamp 0.

On-prem costs (`*.yaml` / `*.yml`)::

    region: onprem            # optional default for every node (default "onprem")
    zone: dc1                 # optional default for every node
    nodes:                    # required, a list
      - name: rack1-gpu       # optional, for people only
        instance_type: dgx-a100
        price_per_hour: 12.5  # the amortised cost of the node per hour, >= 0
        zone: dc1             # required unless the top level gives one
        region: onprem        # optional, overrides the top level
        accelerator_name: A100    # optional, with the three below
        accelerator_count: 8
        vcpus: 256
        memory_gib: 2048

    Unknown keys are refused. Points have market "onprem" and timestamp 0.

Error messages look like ``prices.json: SpotPriceHistory[3].SpotPrice: 'abc' is not a price``,
``catalog.csv: line 7: Price: '-1' is not a price`` or
``onprem.yaml: line 4: nodes[0].price_per_hour: missing``.
"""

import csv
import io
import json
import re
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict

from ferry.common.errors import UsageError

Source = Literal["aws-spot-history", "catalog", "onprem"]
Market = Literal["spot", "on-demand", "onprem"]

CATALOG_COLUMNS = (
    "InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs", "MemoryGiB",
    "Price", "SpotPrice", "Region", "AvailabilityZone",
)
_ONPREM_NODE_KEYS = frozenset({
    "name", "instance_type", "price_per_hour", "zone", "region",
    "accelerator_name", "accelerator_count", "vcpus", "memory_gib",
})
_ONPREM_TOP_KEYS = frozenset({"region", "zone", "nodes"})
_REGION = re.compile(r"^[a-z]{2}(?:-[a-z]+)+-\d+")


class PricePoint(BaseModel):
    """One price of one instance type in one zone and market, as a feed gave it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    source: Source
    zone: str
    region: str = ""
    instance_type: str
    market: Market
    price_per_hour: float
    timestamp: float = 0.0  # epoch seconds; 0 when the feed has no time
    product: str = ""  # AWS ProductDescription ("Linux/UNIX", ...); empty for other feeds
    accelerator_name: str | None = None
    accelerator_count: float | None = None
    vcpus: float | None = None
    memory_gib: float | None = None

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.zone, self.instance_type, self.market, self.product)


def region_of_zone(zone: str) -> str:
    """`us-east-1a` -> `us-east-1`, `us-west-2-lax-1a` -> `us-west-2`; "" when it does not look like one."""
    found = _REGION.match(zone)
    return found.group(0) if found else ""


def _price(value: Any) -> float | None:
    """A finite, non-negative decimal from a string or a JSON number; None when it is not one."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return None
    try:
        number = Decimal(value.strip() if isinstance(value, str) else repr(value))
    except InvalidOperation:
        return None
    if not number.is_finite() or number < 0:
        return None
    return float(number)


def parse_time(value: Any) -> float | None:
    """Epoch seconds of an ISO 8601 time (UTC when it has no offset); None when it is not one."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


# --- AWS spot price history ------------------------------------------------------------------


def parse_spot_history(text: str, source: str) -> list[PricePoint]:
    """Points from `describe-spot-price-history` JSON output; `source` names the file in errors."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{source}: line {exc.lineno} column {exc.colno}: not JSON: {exc.msg}") from exc
    if not isinstance(doc, dict) or "SpotPriceHistory" not in doc:
        raise UsageError(f"{source}: expected an object with a SpotPriceHistory list "
                         "(the output of `aws ec2 describe-spot-price-history`)")
    items = doc["SpotPriceHistory"]
    if not isinstance(items, list):
        raise UsageError(f"{source}: SpotPriceHistory: expected a list, got {type(items).__name__}")
    points = []
    for i, item in enumerate(items):
        where = f"{source}: SpotPriceHistory[{i}]"
        if not isinstance(item, dict):
            raise UsageError(f"{where}: expected an object, got {type(item).__name__}")
        fields: dict[str, str] = {}
        for name in ("AvailabilityZone", "InstanceType", "ProductDescription"):
            value = item.get(name)
            if name not in item:
                raise UsageError(f"{where}.{name}: missing")
            if not isinstance(value, str) or not value.strip():
                raise UsageError(f"{where}.{name}: {value!r} is not a non-empty string")
            fields[name] = value.strip()
        if "SpotPrice" not in item:
            raise UsageError(f"{where}.SpotPrice: missing")
        price = _price(item["SpotPrice"])
        if price is None:
            raise UsageError(f"{where}.SpotPrice: {item['SpotPrice']!r} is not a price")
        if "Timestamp" not in item:
            raise UsageError(f"{where}.Timestamp: missing")
        when = parse_time(item["Timestamp"])
        if when is None:
            raise UsageError(f"{where}.Timestamp: {item['Timestamp']!r} is not an ISO 8601 time")
        zone = fields["AvailabilityZone"]
        points.append(PricePoint(
            source="aws-spot-history", zone=zone, region=region_of_zone(zone),
            instance_type=fields["InstanceType"], market="spot", price_per_hour=price, timestamp=when,
            product=fields["ProductDescription"],
        ))
    return points


# --- catalog CSV -----------------------------------------------------------------------------


def _optional_number(value: str, column: str, where: str) -> float | None:
    if not value.strip():
        return None
    number = _price(value)
    if number is None:
        raise UsageError(f"{where}: {column}: {value!r} is not a non-negative number")
    return number


def _catalog_header(reader: Any, source: str) -> list[str]:
    """The header's column names, checked against CATALOG_COLUMNS."""
    try:
        header = next(reader)
    except StopIteration:
        raise UsageError(f"{source}: empty file: expected the header {','.join(CATALOG_COLUMNS)}") from None
    except csv.Error as exc:
        raise UsageError(f"{source}: line 1: {exc}") from exc
    names = [h.strip() for h in header]
    missing = [c for c in CATALOG_COLUMNS if c not in names]
    unknown = [n for n in names if n not in CATALOG_COLUMNS]
    doubled = sorted({n for n in names if names.count(n) > 1})
    problems = [f"{what} column(s) {', '.join(cols)}" for what, cols in
                (("missing", missing), ("unknown", unknown), ("repeated", doubled)) if cols]
    if problems:
        raise UsageError(f"{source}: line 1: {'; '.join(problems)} (expected {','.join(CATALOG_COLUMNS)})")
    return names


def _catalog_price(cell: dict[str, str], column: str, where: str) -> float | None:
    if not cell[column]:
        return None
    price = _price(cell[column])
    if price is None:
        raise UsageError(f"{where}: {column}: {cell[column]!r} is not a price")
    return price


def _catalog_points(cell: dict[str, str], where: str) -> list[PricePoint]:
    """The on-demand and spot points of one catalog row."""
    for required in ("InstanceType", "Region"):
        if not cell[required]:
            raise UsageError(f"{where}: {required}: empty")
    on_demand = _catalog_price(cell, "Price", where)
    spot = _catalog_price(cell, "SpotPrice", where)
    if on_demand is None and spot is None:
        raise UsageError(f"{where}: Price and SpotPrice are both empty")
    common: dict[str, Any] = {
        "source": "catalog",
        "zone": cell["AvailabilityZone"] or cell["Region"],
        "region": cell["Region"],
        "instance_type": cell["InstanceType"],
        "accelerator_name": cell["AcceleratorName"] or None,
        "accelerator_count": _optional_number(cell["AcceleratorCount"], "AcceleratorCount", where),
        "vcpus": _optional_number(cell["vCPUs"], "vCPUs", where),
        "memory_gib": _optional_number(cell["MemoryGiB"], "MemoryGiB", where),
    }
    return [PricePoint(market=market, price_per_hour=price, **common)
            for market, price in (("on-demand", on_demand), ("spot", spot)) if price is not None]


def parse_catalog_csv(text: str, source: str) -> list[PricePoint]:
    """Points from a catalog CSV (see the module docstring); `source` names the file in errors."""
    reader = csv.reader(io.StringIO(text.removeprefix("\ufeff"), newline=""))
    names = _catalog_header(reader, source)
    index = {name: i for i, name in enumerate(names)}
    points: list[PricePoint] = []
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise UsageError(f"{source}: line {reader.line_num}: {exc}") from exc
        where = f"{source}: line {reader.line_num}"
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(names):
            raise UsageError(f"{where}: {len(row)} field(s), the header has {len(names)}")
        points += _catalog_points({name: row[i].strip() for name, i in index.items()}, where)
    return points


# --- on-prem YAML ----------------------------------------------------------------------------


def _yaml_line(root: yaml.Node | None, path: list[str | int]) -> int | None:
    """The 1-based line of the node at `path` (or of its deepest existing parent)."""
    node = root
    line = node.start_mark.line + 1 if node is not None else None
    for step in path:
        if isinstance(node, yaml.MappingNode) and isinstance(step, str):
            found = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == step), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(step, int) and step < len(node.value):
            found = node.value[step]
        else:
            found = None
        if found is None:
            break
        node = found
        line = node.start_mark.line + 1
    return line


def _key_path(path: list[str | int]) -> str:
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else step)
    return out


Fail = Callable[[list[str | int], str], UsageError]


def _onprem_defaults(doc: dict[str, Any], fail: Fail) -> dict[str, str]:
    unknown = sorted(str(k) for k in doc if k not in _ONPREM_TOP_KEYS)
    if unknown:
        raise fail([str(unknown[0])], f"unknown key (expected {', '.join(sorted(_ONPREM_TOP_KEYS))})")
    defaults: dict[str, str] = {}
    for key in ("region", "zone"):
        if key in doc:
            if not isinstance(doc[key], str) or not doc[key].strip():
                raise fail([key], f"{doc[key]!r} is not a non-empty string")
            defaults[key] = doc[key].strip()
    return defaults


def _onprem_strings(node: dict[str, Any], at: list[str | int], fail: Fail) -> dict[str, str | None]:
    strings: dict[str, str | None] = {}
    for key in ("instance_type", "zone", "region", "accelerator_name", "name"):
        value = node.get(key)
        if value is None:
            strings[key] = None
        elif isinstance(value, str) and value.strip():
            strings[key] = value.strip()
        else:
            raise fail([*at, key], f"{value!r} is not a non-empty string")
    return strings


def _onprem_point(node: object, at: list[str | int], defaults: dict[str, str], fail: Fail) -> PricePoint:
    """The point of one entry of `nodes`."""
    if not isinstance(node, dict):
        raise fail(at, "expected a mapping")
    extra = sorted(str(k) for k in node if k not in _ONPREM_NODE_KEYS)
    if extra:
        raise fail([*at, extra[0]], f"unknown key (expected {', '.join(sorted(_ONPREM_NODE_KEYS))})")
    strings = _onprem_strings(node, at, fail)
    if strings["instance_type"] is None:
        raise fail([*at, "instance_type"], "missing")
    zone = strings["zone"] or defaults.get("zone")
    if zone is None:
        raise fail([*at, "zone"], "missing (give it here or at the top level)")
    if "price_per_hour" not in node:
        raise fail([*at, "price_per_hour"], "missing")
    price = _price(node["price_per_hour"])
    if price is None:
        raise fail([*at, "price_per_hour"], f"{node['price_per_hour']!r} is not a price")
    numbers: dict[str, float | None] = {}
    for key in ("accelerator_count", "vcpus", "memory_gib"):
        value = node.get(key)
        numbers[key] = None if value is None else _price(value)
        if value is not None and numbers[key] is None:
            raise fail([*at, key], f"{value!r} is not a non-negative number")
    return PricePoint(
        source="onprem", zone=zone, region=strings["region"] or defaults.get("region", "onprem"),
        instance_type=strings["instance_type"], market="onprem", price_per_hour=price,
        accelerator_name=strings["accelerator_name"], **numbers,
    )


def parse_onprem_yaml(text: str, source: str) -> list[PricePoint]:
    """Points from an on-prem cost file (see the module docstring); `source` names the file in errors."""
    try:
        doc = yaml.safe_load(text)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"{source}: {where}not YAML: {problem}") from exc

    def fail(path: list[str | int], message: str) -> UsageError:
        line = _yaml_line(root, path)
        prefix = f"line {line}: " if line is not None else ""
        return UsageError(f"{source}: {prefix}{_key_path(path) or '(top level)'}: {message}")

    if not isinstance(doc, dict):
        raise fail([], "expected a mapping with a `nodes` list")
    defaults = _onprem_defaults(doc, fail)
    if "nodes" not in doc:
        raise fail([], "missing key `nodes`")
    nodes = doc["nodes"]
    if not isinstance(nodes, list):
        raise fail(["nodes"], "expected a list of nodes")
    return [_onprem_point(node, ["nodes", i], defaults, fail) for i, node in enumerate(nodes)]


# --- files -----------------------------------------------------------------------------------


def feed_kind(path: str | Path, text: str) -> Source:
    """Which parser a file needs: by extension, else by its first non-blank character or line."""
    suffix = Path(path).suffix.lower()
    if suffix == ".json":
        return "aws-spot-history"
    if suffix == ".csv":
        return "catalog"
    if suffix in (".yaml", ".yml"):
        return "onprem"
    head = text.removeprefix("\ufeff").lstrip()
    if head.startswith(("{", "[")):
        return "aws-spot-history"
    first_line = head.split("\n", 1)[0]
    if "InstanceType" in first_line and "," in first_line:
        return "catalog"
    return "onprem"


_PARSERS = {
    "aws-spot-history": parse_spot_history,
    "catalog": parse_catalog_csv,
    "onprem": parse_onprem_yaml,
}


def load_feed(path: str | Path) -> list[PricePoint]:
    """Reads one feed file and parses it with the parser its extension or content calls for."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read price feed {path}: {exc}") from exc
    return _PARSERS[feed_kind(path, text)](text, str(path))


# --- the book --------------------------------------------------------------------------------


class PriceBook:
    """The latest point per (zone, instance type, market, product).

    A point replaces the one it shares a key with when its timestamp is newer or equal (so a
    reloaded catalog, whose points all have timestamp 0, updates its prices); an older point is
    ignored.
    """

    def __init__(self, points: Iterable[PricePoint] = ()) -> None:
        self._latest: dict[tuple[str, str, str, str], PricePoint] = {}
        self.add(points)

    def add(self, points: Iterable[PricePoint]) -> list[PricePoint]:
        """Adds points; returns those that changed the book (the price events worth publishing)."""
        before: dict[tuple[str, str, str, str], PricePoint | None] = {}
        for point in points:
            current = self._latest.get(point.key)
            if current is not None and point.timestamp < current.timestamp:
                continue
            before.setdefault(point.key, current)
            self._latest[point.key] = point
        return [self._latest[k] for k, old in before.items() if self._latest[k] != old]

    def latest(self, zone: str, instance_type: str, market: Market, product: str | None = None) -> PricePoint | None:
        """The latest point for the key; with `product` None, the newest over all products
        (the cheapest of those when several share that time)."""
        if product is not None:
            return self._latest.get((zone, instance_type, market, product))
        found = [p for (z, t, m, _), p in self._latest.items() if (z, t, m) == (zone, instance_type, market)]
        if not found:
            return None
        return max(found, key=lambda p: (p.timestamp, -p.price_per_hour))

    def as_table(self) -> list[PricePoint]:
        """The latest point of every key, sorted by zone, instance type, market and product."""
        return [self._latest[k] for k in sorted(self._latest)]

    def __len__(self) -> int:
        return len(self._latest)

