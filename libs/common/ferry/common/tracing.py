"""OpenTelemetry set-up and W3C context propagation through NATS headers and gRPC metadata.

One checkpoint, restore or move is one trace: the API starts it, every hop injects the context
into the headers of the message it sends, and the receiver continues it.
"""

from collections.abc import Mapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ferry.common.config import Settings

_PROPAGATOR = TraceContextTextMapPropagator()
_configured = False


def setup_tracing(service: str, settings: Settings, processor: SpanProcessor | None = None) -> None:
    """Installs a tracer provider for `service` with the configured exporter (once per process).
    With none (the default) no provider is installed: OpenTelemetry's no-op tracer still carries
    an incoming trace context on to what the service sends (a hop that exports nothing shows no
    span of its own), and a service spends nothing on spans that go nowhere (they were about 4%
    of the scheduler's and the API's CPU in a burst of submits)."""
    global _configured
    if _configured:
        return
    _configured = True
    if processor is None and settings.otel_exporter == "none":
        return
    provider = TracerProvider(resource=Resource.create({"service.name": f"ferry-{service}"}))
    if processor is not None:
        provider.add_span_processor(processor)
    elif settings.otel_exporter == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    elif settings.otel_exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=settings.otel_endpoint or None)
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(f"ferry.{name}")


def inject(headers: dict[str, str] | None = None) -> dict[str, str]:
    """The current trace context as headers (traceparent, tracestate), merged into `headers`."""
    carrier: dict[str, str] = dict(headers or {})
    _PROPAGATOR.inject(carrier)
    return carrier


def extract(headers: Mapping[str, Any] | None) -> otel_context.Context:
    """The trace context carried by `headers` (an empty context when there is none)."""
    carrier = {str(k).lower(): str(v) for k, v in (headers or {}).items()}
    return _PROPAGATOR.extract(carrier)
