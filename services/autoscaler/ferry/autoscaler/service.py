"""The autoscaler service: carries out ``ferry.policy.autoscale``'s plans through a provider.

It follows the jobs, the nodes, its own fleet records and the policy ``ferry autoscale`` sets with
watches, and plans again on every change and every ``autoscale_every_s`` (a node's underused time
runs out without any write). Without a policy, or without a provider (``FERRY_PROVIDER``), it
only watches.

- Scale up (for jobs that wait, and for right-sized jobs that outgrew every node): a fleet record
  ``launching``, a ``scale_up`` event with the hourly cost and the jobs it is for, the provider's
  launch; then ``running`` (the node joins by itself: its services beat like any node's) or
  ``failed`` with the provider's reason (event ``launch_refused``; that offer rests for
  ``REFUSED_REST_S``). The cluster stays as it was.
- Scale down: a fleet record ``retiring``, a ``scale_down`` event with the hourly saving, then a
  drain through the scheduler (its jobs move away with checkpoints: never lost, never twice); once
  every job that was there runs elsewhere (or is parked or ended) the provider terminates the node
  and its record goes. A drain that does not empty the node within ``autoscale_drain_timeout_s``
  is undone (event ``scale_down_abandoned``).

A restarted autoscaler picks up what its records say: retiring nodes go on retiring; a launch it
was waiting for is settled from the provider's list of nodes.
"""

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Collection, Sequence
from typing import Any

from ferry.common import wire
from ferry.common.errors import FerryError
from ferry.common.mirror import Mirror
from ferry.common.models import AutoscalePolicy, Event, FleetNode, Job, JobState, Node, Op, OpKind, new_id, now
from ferry.common.service import Service, service_main
from ferry.fleet.provider import InstanceType, LaunchRefused, ProvidedNode, Provider
from ferry.fleet.providers import make_provider
from ferry.policy import autoscale
from ferry.policy.views import holds_capacity, job_view, node_views

log = logging.getLogger(__name__)

POLICY_KEY = "policy"
REFUSED_REST_S = 60.0
LAUNCH_FOLLOW_S = 600.0  # how long a launch left under way by a restart is waited for
LAUNCH_POLL_S = 2.0
JOIN_GRACE_S = 120.0  # a launched node that has not joined yet still counts as launching


def offer_of(t: InstanceType, nodes: Sequence[Node] = (), at: float = 0.0) -> autoscale.Offer:
    """The planner's view of an instance type: with the interruption history of the nodes of the
    same zone and market (preemptions seen, time watched), which the scheduler's score weighs."""
    alike = [n for n in nodes if n.spot == t.spot and n.labels.get("zone") == t.zone]
    return autoscale.Offer(instance_type=t.name, zone=t.zone, spot=t.spot, price_per_hour=t.price_per_hour,
                           cpus=t.cpus, memory_bytes=t.memory, gpus=t.gpus,
                           preemptions=sum(n.preemptions for n in alike),
                           uptime_s=sum(max(0.0, at - n.started) for n in alike))


def rec_still_launching(rec: FleetNode) -> ProvidedNode:
    """What to assume of a launch while the provider cannot be asked: still under way."""
    return ProvidedNode(id=rec.id, instance_type="", zone="", spot=False, state="launching")


class Autoscaler(Service):
    name = "autoscaler"

    async def start(self) -> None:
        bus = await self.connect()
        self.provider: Provider | None = make_provider(self.settings)
        self.changed = asyncio.Event()
        self.jobs: Mirror[Job] = Mirror(bus.jobs, changed=self.changed, live=lambda j: not j.terminal)
        self.nodes: Mirror[Node] = Mirror(bus.nodes, changed=self.changed)
        self.fleet: Mirror[FleetNode] = Mirror(bus.fleet, changed=self.changed)
        self.policy: Mirror[AutoscalePolicy] = Mirror(bus.autoscale, changed=self.changed)
        for mirror in (self.jobs, self.nodes, self.fleet, self.policy):
            await mirror.start()
        self.underused: dict[str, float] = {}
        self.refused: dict[str, float] = {}  # offer key -> until when it rests
        self.busy: dict[str, asyncio.Task[None]] = {}  # node -> its launch or retirement
        self.offers: list[InstanceType] = []
        self.last_stuck: dict[str, str] = {}
        await self.resume()

    async def resume(self) -> None:
        """Carries on with what the fleet records say was under way when the last one stopped."""
        if self.provider is None:
            return
        provided = {n.id: n for n in await self.provider.nodes()}
        for rec in self.fleet.view():
            if rec.state == "retiring":
                self.busy[rec.id] = self.spawn(self.retire(rec.id, rec.price_per_hour, rec.reason, rec.op))
            elif rec.state == "launching":
                got = provided.get(rec.id)
                if got is not None and got.state == "launching":  # the provider still starts it: wait on
                    self.busy[rec.id] = self.spawn(self.follow_launch(rec))
                    continue
                state = "running" if got is not None and got.state == "running" else "failed"
                await self.record(rec.model_copy(update={"state": state, "since": now(), "reason": (
                    rec.reason if state == "running" else "the autoscaler restarted during the launch")}))

    async def follow_launch(self, rec: FleetNode) -> None:
        """A launch the last autoscaler left under way: waits for the provider's node to run (it
        is then recorded as launched) or to fail; one that never gets there within
        ``LAUNCH_FOLLOW_S`` is terminated, so that nothing is left running and unaccounted for."""
        assert self.provider is not None
        deadline = asyncio.get_running_loop().time() + LAUNCH_FOLLOW_S
        try:
            while True:
                try:
                    got = next((n for n in await self.provider.nodes() if n.id == rec.id), None)
                except FerryError as exc:  # the provider's API failed this time: again in a moment
                    log.warning("following the launch of %s: %s", rec.id, exc)
                    got = rec_still_launching(rec)
                if got is not None and got.state == "running":
                    await self.record(rec.model_copy(update={"state": "running", "since": now()}))
                    await self.emit("node_launched", rec.id, f"{rec.offer} runs (its launch outlived an autoscaler "
                                    "restart); its services join the cluster", offer=rec.offer)
                    return
                if got is None or got.state != "launching":
                    why = got.reason if got is not None and got.reason else "it never ran"
                    await self.record(rec.model_copy(update={"state": "failed", "since": now(),
                                                             "reason": f"the provider's launch failed: {why}"}))
                    await self.emit("launch_failed", rec.id, f"{rec.offer}: {why}", offer=rec.offer)
                    return
                if asyncio.get_running_loop().time() > deadline:
                    await self.provider.terminate(rec.id)
                    await self.record(rec.model_copy(update={"state": "failed", "since": now(), "reason": (
                        f"it did not run within {LAUNCH_FOLLOW_S:.0f} s of the autoscaler's restart: terminated")}))
                    await self.emit("launch_failed", rec.id, f"{rec.offer}: did not run; terminated", offer=rec.offer)
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), LAUNCH_POLL_S)
                if self.stopping.is_set():
                    return  # the record stays launching: the next autoscaler follows it again
        except FerryError as exc:  # terminating it failed: the record stays launching for the next start
            log.warning("following the launch of %s: %s", rec.id, exc)
        finally:
            self.busy.pop(rec.id, None)
            self.changed.set()

    async def record(self, rec: FleetNode) -> None:
        assert self.bus is not None
        self.fleet.note(rec.id, rec, await self.bus.fleet.put(rec.id, rec))

    async def emit(self, kind: str, node: str, message: str, **data: Any) -> None:
        assert self.bus is not None
        log.info("%s %s: %s", kind, node, message)
        # an event about no node (a job no launch helps) has no key: "" is no subject token
        await self.bus.publish(wire.cluster_event_subject(kind, node or None),
                               Event(kind=kind, node=node, message=message, data=data))

    async def run(self) -> None:
        while not self.stopping.is_set():
            self.changed.clear()
            try:
                await self.step_bounded(self.step())  # a provider's call may take its 30 s timeout
            except FerryError as exc:
                log.error("autoscaling: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), self.settings.autoscale_every_s)

    def fleet_view(self, t: float, nodes: list[Node], offers: list[autoscale.Offer]) -> autoscale.Fleet:
        jobs = self.jobs.live()
        views = node_views(nodes, jobs, t, self.settings.heartbeat_timeout_s)
        joined = {v.id for v in views if v.usable}
        records = {r.id: r for r in self.fleet.view()}
        by_key = {o.key: o for o in offers}
        launching = [by_key[r.offer] for r in records.values() if r.offer in by_key and (
            r.state == "launching" or (r.state == "running" and r.id not in joined and t - r.since < JOIN_GRACE_S))]
        managed = frozenset(self.managed)
        jobs_on: dict[str, list[Any]] = {}
        for j in jobs:
            if holds_capacity(j) and j.node:
                jobs_on.setdefault(j.node, []).append(job_view(j, t))
        waiting = [(job_view(j, t), t - j.created) for j in jobs
                   if j.state == JobState.PENDING and j.node is None and not j.requested_node]
        # right-sized past what any node has free: it waits for a node too (``ferry.policy.rightsize``)
        waiting += [(job_view(j, t), t - j.updated) for j in jobs if j.outgrown and j.state == JobState.RUNNING]
        retiring = frozenset(r.id for r in records.values() if r.state == "retiring")
        gone = {r.id for r in records.values() if r.state == "terminated"}
        return autoscale.Fleet(nodes=[v for v in views if v.id not in gone], managed=managed, launching=launching,
                               retiring=retiring, jobs_on=jobs_on, waiting=waiting,
                               refused=frozenset(k for k, until in self.refused.items() if until > t))

    async def step(self) -> None:
        policy = self.policy.peek(POLICY_KEY)
        if policy is None or not policy.enabled or self.provider is None:
            return
        self.offers = await self.provider.instance_types()
        provided = await self.provider.nodes()
        self.managed = {n.id for n in provided if n.state == "running"}
        await self.note_interruptions(provided)
        t = now()
        nodes = self.nodes.view()
        offers = [offer_of(o, nodes, t) for o in self.offers]
        fleet = self.fleet_view(t, nodes, offers)
        result = autoscale.plan(policy, fleet, offers, t, self.underused)
        self.underused = result.underused_since
        for job, why in result.stuck.items():
            if self.last_stuck.get(job) != why:
                await self.emit("scale_up_blocked", "", f"job {job}: {why}", job=job)
        # said once per job and reason while it waits: a step in between that counts a launch
        # under way for it (then refused) does not make the same event again
        waiting = {j.id for j, _ in fleet.waiting}
        self.last_stuck = {job: why for job, why in {**self.last_stuck, **result.stuck}.items() if job in waiting}
        for action in result.actions:
            if isinstance(action, autoscale.ScaleUp):
                await self.launch(action)
            elif action.node not in self.busy:
                self.underused.pop(action.node, None)
                rec = FleetNode(id=action.node, provider=self.provider.name, offer="", state="retiring",
                                price_per_hour=action.saving_per_hour, reason=action.reason, op=new_id("op"))
                await self.record(rec)
                self.busy[action.node] = self.spawn(self.retire(action.node, action.saving_per_hour, action.reason,
                                                                rec.op))

    async def note_interruptions(self, provided: Sequence[ProvidedNode]) -> None:
        """A node the provider took back (a spot reclaim) is gone from the fleet: its record ends
        with an event (its jobs are the health service's: they fail over from their checkpoints)."""
        records = {r.id: r for r in self.fleet.view()}
        for node in provided:
            rec = records.get(node.id)
            if node.interrupted and rec is not None and rec.state == "running" and node.id not in self.busy:
                await self.record(rec.model_copy(update={"state": "terminated", "since": now(),
                                                         "reason": node.reason or "interrupted by the provider"}))
                await self.emit("node_interrupted", node.id, f"{rec.offer}: {node.reason or 'taken back'}",
                                offer=rec.offer)

    async def launch(self, action: autoscale.ScaleUp) -> None:
        assert self.provider is not None
        offer = next(o for o in self.offers if o.key == action.offer.key)
        node_id = f"auto-{uuid.uuid4().hex[:6]}"
        rec = FleetNode(id=node_id, provider=self.provider.name, offer=action.offer.key, state="launching",
                        price_per_hour=offer.price_per_hour, reason=action.reason)
        await self.record(rec)
        await self.emit("scale_up", node_id, action.reason, offer=action.offer.key, jobs=list(action.jobs),
                        cost_per_hour=offer.price_per_hour)
        self.busy[node_id] = self.spawn(self._launch(rec, offer))

    async def _launch(self, rec: FleetNode, offer: InstanceType) -> None:
        assert self.provider is not None
        try:
            got = await self.provider.launch(rec.id, offer)
            if got.id != rec.id:  # the provider named it (a SLURM node, a Kubernetes node)
                rec = await self.rename(rec, got.id)
        except FerryError as exc:
            rest = isinstance(exc, LaunchRefused)
            self.refused[rec.offer] = now() + REFUSED_REST_S
            await self.record(rec.model_copy(update={"state": "failed", "reason": str(exc), "since": now()}))
            await self.emit("launch_refused" if rest else "launch_failed", rec.id,
                            f"{rec.offer}: {exc}; the cluster stays as it was", offer=rec.offer)
        else:
            await self.record(rec.model_copy(update={"state": "running", "since": now()}))
            await self.emit("node_launched", rec.id, f"{rec.offer} runs; its services join the cluster",
                            offer=rec.offer)
        finally:
            self.busy.pop(rec.id, None)
            self.changed.set()

    async def rename(self, rec: FleetNode, name: str) -> FleetNode:
        assert self.bus is not None
        renamed = rec.model_copy(update={"id": name})
        revision = await self.bus.fleet.put(name, renamed)
        self.fleet.note(name, renamed, revision)
        await self.bus.fleet.delete(rec.id)
        self.fleet.forget(rec.id, revision)
        self.busy[name] = self.busy.pop(rec.id)
        await self.emit("node_named", name, f"the provider named {rec.id} {name}", requested=rec.id)
        return renamed

    async def drain_node(self, node: str, op: str, undo: bool = False) -> None:
        assert self.bus is not None
        cmd = wire.SchedulerCommand(op=op, kind=OpKind.DRAIN, node=node, stop=undo)
        await self.bus.ops.put(op, Op(id=op, kind=OpKind.DRAIN))
        await self.bus.publish(wire.SCHEDULER_CMD, cmd, msg_id=op)

    def holding(self, node: str, moving: Collection[str] = ()) -> list[Job]:
        """The jobs that keep `node` from being terminated: those that hold capacity there, and of
        `moving` (its jobs when the drain began) those not yet settled elsewhere (running with no
        op, parked or ended): a restore that fails on the target falls back to the source."""
        return [j for j in self.jobs.live() if (holds_capacity(j) and node in (j.node, j.moving_to)) or (
            j.id in moving and (j.op is not None or j.state not in (JobState.RUNNING, JobState.PREEMPTED)))]

    async def retire(self, node: str, saving: float, reason: str, op: str) -> None:
        assert self.provider is not None and self.bus is not None
        try:
            await self.emit("scale_down", node, reason, saving_per_hour=saving)
            moving = {j.id for j in self.holding(node)}
            await self.drain_node(node, op)
            deadline = asyncio.get_running_loop().time() + self.settings.autoscale_drain_timeout_s
            listener = self.jobs.listen()
            try:
                while self.holding(node, moving):
                    left = deadline - asyncio.get_running_loop().time()
                    if left <= 0:
                        await self.drain_node(node, new_id("op"), undo=True)
                        await self.record(FleetNode(id=node, provider=self.provider.name, offer="", state="running",
                                                    reason="its drain did not end in time"))
                        limit = self.settings.autoscale_drain_timeout_s
                        await self.emit("scale_down_abandoned", node, f"{len(self.holding(node))} job(s) still there "
                                        f"after {limit:.0f}s; the node takes work again")
                        return
                    listener.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(listener.wait(), min(left, 5.0))
            finally:
                self.jobs.unlisten(listener)
            await self.provider.terminate(node)
            with contextlib.suppress(FerryError):
                await self.bus.nodes.delete(node)
            await self.record(FleetNode(id=node, provider=self.provider.name, offer="", state="terminated",
                                        price_per_hour=saving, reason=reason))
            await self.emit("node_retired", node, f"terminated; saves {saving:.3f} USD/h", saving_per_hour=saving)
        finally:
            self.busy.pop(node, None)
            self.changed.set()

    async def close(self) -> None:
        for mirror in ("jobs", "nodes", "fleet", "policy"):
            if hasattr(self, mirror):
                await getattr(self, mirror).close()
        await super().close()


def main() -> None:
    service_main(Autoscaler)


if __name__ == "__main__":
    main()
