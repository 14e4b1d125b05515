"""What a node samples of its jobs' use: the process tree's memory and CPU (psutil over /proc) and,
with GPUs, the GPU memory the tree holds on its busiest GPU (NVML's compute processes)."""

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from ferry.criu.jobdir import ShimInfo
from ferry.node.usage import UsageSampler, nvml_gpu_use
from tests.gpu_fakes import H100_0, H100_1, FakeGpu, FakeNvml

GIB = 1 << 30


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; x = bytearray(32 << 20); time.sleep(60)"])
    time.sleep(0.5)
    yield proc
    proc.kill()
    proc.wait()


def info(pid: int, incarnation: int = 1) -> ShimInfo:
    return ShimInfo(shim_pid=pid, pid=pid, incarnation=incarnation, started=time.time(), mode="launch")


def test_memory_and_the_busiest_gpu_of_a_job_tree(child: subprocess.Popen[bytes]) -> None:
    gpus = [FakeGpu(**H100_0), FakeGpu(**H100_1)]
    gpus[0].procs = [(child.pid, 5 * GIB), (1, 9 * GIB)]  # another process's memory is not the job's
    gpus[1].procs = [(child.pid, 7 * GIB)]
    sampler = UsageSampler(every_s=0.0, gpu_use=nvml_gpu_use(FakeNvml(gpus)))
    first = sampler.sample({"j": info(child.pid)})["j"]
    assert first.rss_bytes > 32 << 20 and first.peak_rss_bytes == first.rss_bytes
    assert (first.gpu_memory_bytes, first.peak_gpu_memory_bytes, first.gpu_utilization) == (
        7 * GIB, 7 * GIB, H100_1["util"])
    gpus[1].procs = [(child.pid, 2 * GIB)]
    second = sampler.sample({"j": info(child.pid)})["j"]
    assert (second.gpu_memory_bytes, second.peak_gpu_memory_bytes) == (5 * GIB, 7 * GIB)
    # restored (a new incarnation): the peak starts again
    third = sampler.sample({"j": info(child.pid, incarnation=2)})["j"]
    assert third.peak_gpu_memory_bytes == 5 * GIB


def test_a_gpu_read_that_fails_leaves_gpu_use_at_zero(child: subprocess.Popen[bytes]) -> None:
    broken = FakeGpu(**H100_0, errors={"*": 999})
    sampler = UsageSampler(every_s=0.0, gpu_use=nvml_gpu_use(FakeNvml([broken])))
    got = sampler.sample({"j": info(child.pid)})["j"]
    assert got.rss_bytes > 0 and (got.gpu_memory_bytes, got.gpu_utilization) == (0, 0.0)
    assert UsageSampler().sample({"gone": info(2**22 + 7)}) == {}
