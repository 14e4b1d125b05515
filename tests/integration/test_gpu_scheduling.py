"""GPU faults drive scheduling: node services whose NVML is a fake with recorded values report their
GPUs and conditions in their heartbeats, and the real scheduler reacts. A job on a GPU with
uncorrectable ECC errors is checkpointed and moved; a GPU that fell off the bus sends its job back
from the last checkpoint; no GPU work is placed on an unhealthy GPU. Real NATS and CRIU; the services
run in this process so that the fake NVML can be handed to them."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from ferry.api.service import Api
from ferry.checkpointer.service import Checkpointer
from ferry.common.config import Settings
from ferry.common.ports import free_port
from ferry.common.service import Service
from ferry.gpu.monitor import GpuMonitor
from ferry.migrator.service import Migrator
from ferry.scheduler.service import Scheduler
from ferry.v1 import ferry_pb2 as pb
from ferry.v1 import ferry_pb2_grpc as pb_grpc
from tests.conftest import make_secrets, serving
from tests.gpu_fakes import H100_0, H100_1, FakeGpu, FakeNvml

pytestmark = pytest.mark.criu

GPU_IS_LOST = 15


def fake_checkpointer(nvml: FakeNvml) -> type[Checkpointer]:
    class WithFakeNvml(Checkpointer):
        def make_gpu_monitor(self) -> GpuMonitor:
            return GpuMonitor(nvml)

    return WithFakeNvml


async def until(stub: pb_grpc.FerryAdminAsyncStub, job: str, check: Callable[[pb.Job], bool], what: str,
                timeout: float = 60) -> pb.Job:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        got: pb.Job = await stub.GetJob(pb.JobRef(job=job))
        if check(got):
            return got
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}: {got}"
        await asyncio.sleep(0.2)


async def test_gpu_faults_move_jobs_and_keep_gpu_work_away(nats_url: str, tmp_path: Path, criu_bin: str) -> None:
    nvml = {"ga": FakeNvml([FakeGpu(**H100_0)]), "gb": FakeNvml([FakeGpu(**H100_1)])}
    make_secrets(tmp_path)
    base = Settings(nats_url=nats_url, data_dir=tmp_path, addr=f"127.0.0.1:{free_port()}", heartbeat_interval_s=0.3,
                    heartbeat_timeout_s=5, scratch_dir=str(tmp_path / "scratch"))
    services: list[Service] = [Scheduler(base), Api(base)]
    for node, fake in nvml.items():
        settings = base.model_copy(update={"node_id": node})
        services += [fake_checkpointer(fake)(settings), Migrator(settings)]
    async with serving(services, base.addr) as stub:
        for _ in range(100):
            nodes = (await stub.ListNodes(pb.ListNodesRequest())).nodes
            if len(nodes) == 2 and all(n.gpu_list for n in nodes):
                break
            await asyncio.sleep(0.1)
        assert {n.id: [g.uuid for g in n.gpu_list] for n in nodes} == {
            "ga": [H100_0["uuid"]], "gb": [H100_1["uuid"]]}
        argv = ["sh", "-c", "i=0; while true; do i=$((i+1)); echo $i; sleep 0.05; done"]
        job = await stub.SubmitJob(pb.SubmitJobRequest(name="trainer", argv=argv, cwd="/", gpus=1,
                                                       gpu_model="H100", node="ga"))
        assert job.state == "running" and list(job.gpu_uuids) == [H100_0["uuid"]]

        # uncorrectable ECC errors on ga's GPU: it still answers, so a final checkpoint, then gb
        nvml["ga"].gpus[0] = dataclasses.replace(nvml["ga"].gpus[0], ecc_uncorrected=3)
        moved = await until(stub, "trainer", lambda j: j.node == "gb" and j.state == "running",
                            "the job to leave the faulty GPU")
        assert list(moved.gpu_uuids) == [H100_1["uuid"]] and moved.restarts == 1
        final = (await stub.ListCheckpoints(pb.JobRef(job="trainer"))).checkpoints[-1]
        assert final.final and final.node == "ga"
        ga = next(n for n in (await stub.ListNodes(pb.ListNodesRequest())).nodes if n.id == "ga")
        assert not ga.gpu_list[0].healthy and any("ecc" in c for c in ga.gpu_conditions)

        # no GPU work goes to the unhealthy GPU: nothing else is free, so this one waits
        other = await stub.SubmitJob(pb.SubmitJobRequest(name="waits", argv=["sleep", "600"], cwd="/", gpus=1))
        assert other.state == "pending" and "ga" in other.reason

        # gb's GPU falls off the bus: the job comes back from its last checkpoint, and with no
        # healthy GPU left anywhere it is parked until one returns
        nvml["gb"].gpus[0] = dataclasses.replace(nvml["gb"].gpus[0], errors={"*": GPU_IS_LOST})
        parked = await until(stub, "trainer", lambda j: j.state == "preempted", "the job to be parked")
        assert "GPU" in parked.reason
        # the GPU comes back healthy (a reset): the parked job resumes from its checkpoint
        nvml["gb"].gpus[0] = dataclasses.replace(nvml["gb"].gpus[0], errors={})
        back = await until(stub, "trainer", lambda j: j.state == "running", "the job to resume")
        assert back.node == "gb"
        for name in ("trainer", "waits"):
            await stub.KillJob(pb.KillJobRequest(job=name, grace_s=0))
