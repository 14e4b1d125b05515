"""Pure mappings between Ferry's records and the admin API's protobuf messages."""

import json
import time
from typing import Any

from ferry.common.models import (
    AuditEntry,
    AutoscalePolicy,
    CheckpointRecord,
    Event,
    FleetNode,
    Job,
    Node,
    Op,
    PriceRecord,
)
from ferry.policy import progress
from ferry.v1 import ferry_pb2 as pb

SEALED = "<sealed>"  # what the API shows of an environment variable's value: the nodes alone open them


def job_to_pb(job: Job, rss_bytes: int = 0) -> pb.Job:
    return pb.Job(
        id=job.id, name=job.name, argv=job.argv, env=dict.fromkeys(job.env.names, SEALED), cwd=job.cwd,
        state=job.state.value, tenant=job.tenant,
        node=job.node or "", restarts=job.restarts, last_checkpoint=job.last_checkpoint or "",
        has_exit_code=job.exit_code is not None, exit_code=job.exit_code or 0, error=job.error or "",
        created=job.created, updated=job.updated, checkpoint_every_s=job.checkpoint_every_s,
        priority=job.priority, incarnation=job.incarnation, reason=job.reason or "", checkpoints=job.checkpoints,
        cpus=job.cpus, memory_bytes=job.memory_bytes, gpus=job.gpus, deadline=job.deadline or 0.0,
        max_downtime_s=job.max_downtime_s or 0.0, gpu_model=job.gpu_model or "", gpu_memory_bytes=job.gpu_memory_bytes,
        gpu_uuids=job.gpu_uuids, network=job.network.value, here=job.here,
        adopt_pid=job.adopt_pid or 0, adopted=job.adopted,
        bundle=job.bundle or "", image=job.image or "", address=job.address or "",
        publish=[str(m) for m in job.publish], labels=job.labels, work_s=job.work_s or 0.0,
        ran_s=progress.ran_s(job, time.time()), gang=job.gang or "", gang_checkpoint=job.gang_checkpoint or "",
        right_size=job.right_size, outgrown=job.outgrown, rss_bytes=rss_bytes,
        last_move_lost_s=job.last_move_lost_s,
    )


def checkpoint_to_pb(c: CheckpointRecord) -> pb.Checkpoint:
    return pb.Checkpoint(
        id=c.id, job=c.job, job_name=c.job_name, parent=c.parent or "", node=c.node, state=c.state,
        created=c.created, criu_version=c.criu_version, kernel=c.kernel, bytes_logical=c.bytes_logical,
        bytes_stored=c.bytes_stored, bytes_uploaded=c.bytes_uploaded, freeze_ms=c.freeze_ms, dump_ms=c.dump_ms,
        upload_ms=c.upload_ms, total_ms=c.total_ms, manifest_key=c.manifest_key, error=c.error or "",
        log_excerpt=c.log_excerpt, final=c.final, gpu_bytes=c.gpu_bytes, gpu_lock_ms=c.gpu_lock_ms,
        gpu_checkpoint_ms=c.gpu_checkpoint_ms, sockets=c.sockets,
    )


def node_to_pb(n: Node) -> pb.Node:
    return pb.Node(
        id=n.id, state=n.state.value, criu_ok=n.criu_ok, criu_version=n.criu_version or "",
        criu_error=n.criu_error or "", lazy_pages=n.lazy_pages, heartbeat=n.heartbeat, cpus=n.cpus,
        memory_bytes=n.memory_bytes, labels=n.labels, jobs=n.jobs, address=n.address,
        price_per_hour=n.price_per_hour, spot=n.spot, gpus=n.gpus, preemptions=n.preemptions,
        notice_deadline=n.notice_deadline or 0.0, gpu_list=[gpu_to_pb(g) for g in n.gpu_list],
        gpu_driver=n.gpu_driver or "", gpu_error=n.gpu_error or "", gpu_conditions=n.gpu_conditions,
        lazy_pages_error=n.lazy_pages_error or "",
    )


def gpu_to_pb(g: dict[str, Any]) -> pb.Gpu:
    return pb.Gpu(
        index=int(g.get("index", 0)), uuid=str(g.get("uuid", "")), model=str(g.get("model", "")),
        memory_total=int(g.get("memory_total") or 0), memory_used=int(g.get("memory_used") or 0),
        utilization_pct=int(g.get("utilization_pct") or 0), temperature_c=int(g.get("temperature_c") or 0),
        power_w=float(g.get("power_w") or 0.0), ecc_uncorrected=int(g.get("ecc_uncorrected") or 0),
        ecc_corrected=int(g.get("ecc_corrected") or 0), throttle_reasons=list(g.get("throttle_reasons") or []),
        xid_events=list(g.get("xid_events") or []), healthy=bool(g.get("healthy", True)),
        problems=list(g.get("problems") or []), lost=bool(g.get("lost", False)),
        pci_bus_id=str(g.get("pci_bus_id", "")),
    )


def price_to_pb(p: PriceRecord) -> pb.Price:
    return pb.Price(zone=p.zone, region=p.region, instance_type=p.instance_type, market=p.market,
                    price_per_hour=p.price_per_hour, timestamp=p.timestamp, source=p.source,
                    previous_price_per_hour=p.previous_price_per_hour or 0.0)


def autoscale_from_pb(p: pb.AutoscalePolicy) -> AutoscalePolicy:
    """The policy a SetAutoscale asks for; a UsageError names what is wrong."""
    return AutoscalePolicy.checked(enabled=p.enabled, min_nodes=p.min_nodes, max_nodes=p.max_nodes,
                                   target_utilization=p.target_utilization, scale_down_after_s=p.scale_down_after_s,
                                   scale_up_after_s=p.scale_up_after_s)


def autoscale_to_pb(p: AutoscalePolicy) -> pb.AutoscalePolicy:
    return pb.AutoscalePolicy(enabled=p.enabled, min_nodes=p.min_nodes, max_nodes=p.max_nodes,
                              target_utilization=p.target_utilization, scale_down_after_s=p.scale_down_after_s,
                              scale_up_after_s=p.scale_up_after_s)


def fleet_to_pb(r: FleetNode) -> pb.FleetNode:
    return pb.FleetNode(id=r.id, provider=r.provider, offer=r.offer, state=r.state, price_per_hour=r.price_per_hour,
                        reason=r.reason, since=r.since)


def event_to_pb(e: Event) -> pb.Event:
    return pb.Event(id=e.id, kind=e.kind, job=e.job, node=e.node, time=e.time, message=e.message,
                    data_json=json.dumps(e.data, sort_keys=True))


def op_to_update(op: Op) -> pb.OpUpdate:
    update = pb.OpUpdate(op=op.id, phase=op.phase, done=op.finished, error=op.error or "",
                         error_code=op.error_code, error_kind=op.error_kind, total_ms=op.total_ms or 0.0)
    if op.restore_ms is not None:
        update.restore_ms = op.restore_ms
    if op.result:
        update.result_json = json.dumps(op.result)
    return update


def audit_to_pb(entry: AuditEntry) -> pb.AuditEntry:
    return pb.AuditEntry(time=entry.time, tenant=entry.tenant, who=entry.who, role=entry.role, method=entry.method,
                         target=entry.target, outcome=entry.outcome, error=entry.error, reason=entry.reason,
                         cost_per_hour=entry.cost_per_hour)
