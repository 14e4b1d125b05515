"""With no exporter configured (the default) a service installs no tracer provider: its spans
record nothing, and what it sends still carries the trace context it received. In a process of
its own: a provider, once installed, stays for the process."""

import json
import subprocess
import sys

SCRIPT = """
import json
from opentelemetry import trace
from ferry.common.config import Settings
from ferry.common.tracing import extract, inject, setup_tracing, tracer
setup_tracing("test", Settings())
parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
with tracer("t").start_as_current_span("hop", context=extract({"traceparent": parent})) as span:
    print(json.dumps({"recording": span.is_recording(), "sent": inject()}))
"""


def test_no_exporter_records_no_span_and_passes_the_trace_on() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin"})
    doc = json.loads(out.stdout)
    assert doc["recording"] is False
    assert doc["sent"]["traceparent"].split("-")[1] == "0af7651916cd43dd8448eb211c80319c"
