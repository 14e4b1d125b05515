"""Price feeds: AWS spot price history JSON, catalog CSVs, on-prem YAML, and the PriceBook."""

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ferry.common.errors import UsageError
from ferry.common.pricefeeds import (
    CATALOG_COLUMNS,
    PriceBook,
    PricePoint,
    feed_kind,
    load_feed,
    parse_catalog_csv,
    parse_onprem_yaml,
    parse_spot_history,
    region_of_zone,
)


def epoch(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def spot_item(**over: Any) -> dict[str, Any]:
    item: dict[str, Any] = {
        "AvailabilityZone": "us-east-1a", "InstanceType": "p3.2xlarge", "ProductDescription": "Linux/UNIX",
        "SpotPrice": "0.918000", "Timestamp": "2023-02-15T10:00:00+00:00",
    }
    item.update(over)
    return item


def spot_doc(*items: dict[str, Any]) -> str:
    return json.dumps({"SpotPriceHistory": list(items), "NextToken": ""}, indent=2)


# --- AWS spot price history ------------------------------------------------------------------


def test_spot_history_points() -> None:
    text = spot_doc(
        spot_item(),
        spot_item(AvailabilityZone="us-west-2-lax-1a", InstanceType="g5.xlarge", SpotPrice="0.4021",
                  Timestamp="2023-02-15T09:30:00.000Z"),
        spot_item(SpotPrice=1.5, Timestamp="2023-02-15T11:00:00", ProductDescription="Windows"),
    )
    points = parse_spot_history(text, "prices.json")
    assert [p.price_per_hour for p in points] == [0.918, 0.4021, 1.5]
    first = points[0]
    assert first == PricePoint(source="aws-spot-history", zone="us-east-1a", region="us-east-1",
                               instance_type="p3.2xlarge", market="spot", price_per_hour=0.918,
                               timestamp=epoch("2023-02-15T10:00:00"), product="Linux/UNIX")
    assert points[1].region == "us-west-2" and points[1].timestamp == epoch("2023-02-15T09:30:00")
    assert points[2].timestamp == epoch("2023-02-15T11:00:00")  # no offset: taken as UTC
    assert points[2].product == "Windows"
    assert parse_spot_history('{"SpotPriceHistory": []}', "empty.json") == []


@pytest.mark.parametrize(("items", "message"), [
    ([spot_item(), spot_item(), spot_item(), spot_item(SpotPrice="abc")],
     "prices.json: SpotPriceHistory[3].SpotPrice: 'abc' is not a price"),
    ([spot_item(SpotPrice="-0.1")], "prices.json: SpotPriceHistory[0].SpotPrice: '-0.1' is not a price"),
    ([spot_item(SpotPrice="NaN")], "SpotPriceHistory[0].SpotPrice: 'NaN' is not a price"),
    ([spot_item(SpotPrice=True)], "SpotPriceHistory[0].SpotPrice: True is not a price"),
    ([spot_item(SpotPrice=None)], "SpotPriceHistory[0].SpotPrice: None is not a price"),
    ([{k: v for k, v in spot_item().items() if k != "InstanceType"}],
     "prices.json: SpotPriceHistory[0].InstanceType: missing"),
    ([spot_item(), spot_item(AvailabilityZone="")], "SpotPriceHistory[1].AvailabilityZone: '' is not a non-empty"),
    ([spot_item(Timestamp="yesterday")], "SpotPriceHistory[0].Timestamp: 'yesterday' is not an ISO 8601 time"),
    ([spot_item(), "p3.2xlarge"], "SpotPriceHistory[1]: expected an object, got str"),
])
def test_spot_history_refuses_bad_items(items: list[Any], message: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_spot_history(json.dumps({"SpotPriceHistory": items}), "prices.json")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_spot_history_refuses_bad_documents() -> None:
    with pytest.raises(UsageError, match=r"^prices\.json: line 3 column \d+: not JSON"):
        parse_spot_history('{"SpotPriceHistory": [\n  {"SpotPrice": "1"},\n  oops\n]}', "prices.json")
    with pytest.raises(UsageError, match=r"^prices\.json: expected an object with a SpotPriceHistory list"):
        parse_spot_history("[]", "prices.json")
    with pytest.raises(UsageError, match=r"^prices\.json: SpotPriceHistory: expected a list, got dict"):
        parse_spot_history('{"SpotPriceHistory": {}}', "prices.json")


def test_region_of_zone() -> None:
    assert region_of_zone("eu-central-1b") == "eu-central-1"
    assert region_of_zone("us-gov-west-1a") == "us-gov-west-1"
    assert region_of_zone("onprem") == ""


# --- catalog CSV -----------------------------------------------------------------------------

CATALOG = """\ufeffRegion,AvailabilityZone,InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,SpotPrice
us-east-1,us-east-1a,p3.2xlarge,V100,1,8,61,3.06,0.918
us-east-1,us-east-1b,m5.large,,,2,8,0.096,

eastus,,Standard_NV4as_v4,Radeon MI25,0.125,4.0,14.0,0.17,0.034
us-central1,us-central1-a,tpu-v5e-1,tpu-v5e,1,,,,1.2
"""


def test_catalog_points() -> None:
    points = parse_catalog_csv(CATALOG, "vms.csv")
    assert [(p.zone, p.instance_type, p.market, p.price_per_hour) for p in points] == [
        ("us-east-1a", "p3.2xlarge", "on-demand", 3.06),
        ("us-east-1a", "p3.2xlarge", "spot", 0.918),
        ("us-east-1b", "m5.large", "on-demand", 0.096),
        ("eastus", "Standard_NV4as_v4", "on-demand", 0.17),  # no zone: priced for the whole region
        ("eastus", "Standard_NV4as_v4", "spot", 0.034),
        ("us-central1-a", "tpu-v5e-1", "spot", 1.2),  # spot-only offer
    ]
    p3 = points[0]
    assert (p3.source, p3.region, p3.accelerator_name, p3.accelerator_count, p3.vcpus, p3.memory_gib,
            p3.timestamp) == ("catalog", "us-east-1", "V100", 1, 8, 61, 0)
    m5 = points[2]
    assert m5.accelerator_name is None and m5.accelerator_count is None and m5.vcpus == 2
    assert points[3].accelerator_count == 0.125


def catalog_with(row: str) -> str:
    return ",".join(CATALOG_COLUMNS) + "\np3.2xlarge,V100,1,8,61,3.06,0.918,us-east-1,us-east-1a\n" + row + "\n"


@pytest.mark.parametrize(("text", "message"), [
    ("", "vms.csv: empty file"),
    ("InstanceType,Price,Region\n", "vms.csv: line 1: missing column(s) AcceleratorName, AcceleratorCount"),
    (",".join(CATALOG_COLUMNS) + ",Notes\n", "vms.csv: line 1: unknown column(s) Notes"),
    (",".join(CATALOG_COLUMNS) + ",Price\n", "vms.csv: line 1: repeated column(s) Price"),
    (catalog_with("m5.large,,,2,8,cheap,,us-east-1,us-east-1b"), "vms.csv: line 3: Price: 'cheap' is not a price"),
    (catalog_with("m5.large,,,2,8,0.1,-2,us-east-1,us-east-1b"), "vms.csv: line 3: SpotPrice: '-2' is not a price"),
    (catalog_with("m5.large,,,2,8,,,us-east-1,us-east-1b"), "vms.csv: line 3: Price and SpotPrice are both empty"),
    (catalog_with(",,,2,8,0.1,,us-east-1,us-east-1b"), "vms.csv: line 3: InstanceType: empty"),
    (catalog_with("m5.large,,,2,8,0.1,,,us-east-1b"), "vms.csv: line 3: Region: empty"),
    (catalog_with("m5.large,,,two,8,0.1,,us-east-1,us-east-1b"), "vms.csv: line 3: vCPUs: 'two' is not"),
    (catalog_with("m5.large,,,2,8,0.1,us-east-1,us-east-1b"), "vms.csv: line 3: 8 field(s), the header has 9"),
    (catalog_with("\n\nm5.large,,,2,8,0.1"), "vms.csv: line 5: 6 field(s)"),
])
def test_catalog_refuses_bad_rows(text: str, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_catalog_csv(text, "vms.csv")
    assert message in str(caught.value)


# --- on-prem YAML ----------------------------------------------------------------------------

ONPREM = """\
region: dc-west
zone: dc1
nodes:
  - name: rack1-gpu
    instance_type: dgx-a100
    price_per_hour: 12.5
    accelerator_name: A100
    accelerator_count: 8
    vcpus: 256
    memory_gib: 2048
  - instance_type: cpu-node
    price_per_hour: "0.40"
    zone: dc2
    region: dc-east
"""


def test_onprem_points() -> None:
    dgx, cpu = parse_onprem_yaml(ONPREM, "onprem.yaml")
    assert dgx == PricePoint(source="onprem", zone="dc1", region="dc-west", instance_type="dgx-a100",
                             market="onprem", price_per_hour=12.5, accelerator_name="A100",
                             accelerator_count=8, vcpus=256, memory_gib=2048)
    assert (cpu.zone, cpu.region, cpu.price_per_hour, cpu.vcpus) == ("dc2", "dc-east", 0.4, None)
    bare = parse_onprem_yaml("nodes:\n  - {instance_type: box, price_per_hour: 1, zone: z1}\n", "o.yaml")
    assert bare[0].region == "onprem"


@pytest.mark.parametrize(("text", "message"), [
    (ONPREM.replace('"0.40"', "free"), "onprem.yaml: line 12: nodes[1].price_per_hour: 'free' is not a price"),
    (ONPREM.replace('    price_per_hour: "0.40"\n', ""), "onprem.yaml: line 11: nodes[1].price_per_hour: missing"),
    (ONPREM.replace("zone: dc1\n", ""), "onprem.yaml: line 3: nodes[0].zone: missing"),
    (ONPREM.replace("vcpus: 256", "vcpus: -1"), "onprem.yaml: line 9: nodes[0].vcpus: -1 is not a non-negative"),
    (ONPREM.replace("    vcpus: 256", "    cpus: 256"), "onprem.yaml: line 9: nodes[0].cpus: unknown key"),
    (ONPREM.replace("  - instance_type: cpu-node", "  - instance_type: [a, b]"),
     "onprem.yaml: line 11: nodes[1].instance_type: ['a', 'b'] is not a non-empty string"),
    (ONPREM.replace("region: dc-west", "currency: EUR"), "onprem.yaml: line 1: currency: unknown key"),
    ("region: dc\n", "onprem.yaml: line 1: (top level): missing key `nodes`"),
    ("nodes: {a: 1}\n", "onprem.yaml: line 1: nodes: expected a list"),
    ("nodes:\n  - 12\n", "onprem.yaml: line 2: nodes[0]: expected a mapping"),
    ("- 1\n- 2\n", "onprem.yaml: line 1: (top level): expected a mapping"),
    ("nodes: [\n  {instance_type: x\n", "onprem.yaml: line 3: not YAML"),
])
def test_onprem_refuses_bad_input(text: str, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_onprem_yaml(text, "onprem.yaml")
    assert message in str(caught.value)


# --- files -----------------------------------------------------------------------------------


def test_load_feed_dispatches_by_extension_then_content(tmp_path: Path) -> None:
    (tmp_path / "prices.json").write_text(spot_doc(spot_item()))
    (tmp_path / "vms.csv").write_text(CATALOG)
    (tmp_path / "costs.yml").write_text(ONPREM)
    (tmp_path / "prices.txt").write_text(spot_doc(spot_item()))
    (tmp_path / "catalog").write_text(CATALOG)
    (tmp_path / "costs").write_text(ONPREM)
    assert [p.source for p in load_feed(tmp_path / "prices.json")] == ["aws-spot-history"]
    assert len(load_feed(tmp_path / "vms.csv")) == 6
    assert {p.market for p in load_feed(tmp_path / "costs.yml")} == {"onprem"}
    assert feed_kind("prices.txt", (tmp_path / "prices.txt").read_text()) == "aws-spot-history"
    assert load_feed(str(tmp_path / "catalog"))[0].source == "catalog"
    assert load_feed(tmp_path / "costs")[0].source == "onprem"


def test_load_feed_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"cannot read price feed .*missing\.json"):
        load_feed(tmp_path / "missing.json")
    bad = tmp_path / "bad.csv"
    bad.write_text(",".join(CATALOG_COLUMNS) + "\nm5.large,,,2,8,x,,us-east-1,\n")
    with pytest.raises(UsageError, match=rf"^{re.escape(str(bad))}: line 2: Price: 'x' is not a price$"):
        load_feed(bad)


# --- the book --------------------------------------------------------------------------------


def point(price: float, ts: float, *, zone: str = "us-east-1a", market: str = "spot",
          product: str = "Linux/UNIX", instance_type: str = "p3.2xlarge") -> PricePoint:
    return PricePoint.model_validate({
        "source": "aws-spot-history", "zone": zone, "instance_type": instance_type, "market": market,
        "price_per_hour": price, "timestamp": ts, "product": product,
    })


def test_price_book_keeps_the_latest() -> None:
    book = PriceBook()
    changed = book.add([point(1.0, 100), point(0.9, 200), point(1.1, 150)])  # 150 is older than 200: ignored
    assert changed == [point(0.9, 200)]
    assert book.latest("us-east-1a", "p3.2xlarge", "spot") == point(0.9, 200)
    assert book.latest("us-east-1a", "p3.2xlarge", "on-demand") is None
    assert book.latest("us-east-1b", "p3.2xlarge", "spot") is None
    assert book.add([point(0.9, 200)]) == []  # nothing new: no price event
    assert book.add([point(0.95, 200)]) == [point(0.95, 200)]  # same time, later input wins
    assert book.add([point(0.5, 300), point(0.95, 200)]) == [point(0.5, 300)]


def test_price_book_products_and_table() -> None:
    book = PriceBook([
        point(2.0, 100, product="Windows"),
        point(0.9, 100),
        point(0.7, 50, zone="us-east-1b"),
        point(3.06, 0, market="on-demand"),
    ])
    assert len(book) == 4
    assert book.latest("us-east-1a", "p3.2xlarge", "spot", "Windows") == point(2.0, 100, product="Windows")
    assert book.latest("us-east-1a", "p3.2xlarge", "spot") == point(0.9, 100)  # newest, then cheapest
    assert [(p.zone, p.market, p.product) for p in book.as_table()] == [
        ("us-east-1a", "on-demand", "Linux/UNIX"),
        ("us-east-1a", "spot", "Linux/UNIX"),
        ("us-east-1a", "spot", "Windows"),
        ("us-east-1b", "spot", "Linux/UNIX"),
    ]
    catalog = parse_catalog_csv(CATALOG, "vms.csv")
    book.add(catalog)
    assert book.latest("us-east-1a", "p3.2xlarge", "on-demand", "") == catalog[0]
