"""A client of a container runtime's CRI endpoint (containerd's ``io.containerd.grpc.v1.cri``),
calling what a kubelet calls, through the messages of ``proto/ferry/v1/cri.proto``.

Pods here share the node's network (``host_network``): no CNI is needed to run or restore them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
import grpc.aio

from ferry.common.errors import FerryError, NotFoundError
from ferry.kube.annotations import RUNTIME_HANDLER
from ferry.v1 import cri_pb2 as cri
from ferry.v1 import cri_pb2_grpc as cri_grpc

CRI_NAMESPACE = "k8s.io"
# the labels a kubelet puts on every container it creates
POD_NAME_LABEL = "io.kubernetes.pod.name"
POD_NAMESPACE_LABEL = "io.kubernetes.pod.namespace"
CONTAINER_NAME_LABEL = "io.kubernetes.container.name"  # containerd's namespace for everything the CRI plugin runs
DEFAULT_RUNC_ROOT = "/run/containerd/runc"
STATES = {cri.CONTAINER_CREATED: "created", cri.CONTAINER_RUNNING: "running", cri.CONTAINER_EXITED: "exited",
          cri.CONTAINER_UNKNOWN: "unknown"}


class CriError(FerryError):
    """The runtime refused a call or could not be reached."""


@dataclass(frozen=True)
class PodSpec:
    """A pod sandbox as a kubelet describes one (only what Ferry's uses need)."""

    name: str
    namespace: str
    uid: str
    log_directory: str
    annotations: Mapping[str, str]
    host_network: bool = True

    def config(self) -> cri.PodSandboxConfig:
        return cri.PodSandboxConfig(
            metadata=cri.PodSandboxMetadata(name=self.name, uid=self.uid, namespace=self.namespace),
            log_directory=self.log_directory, annotations=dict(self.annotations),
            linux=cri.LinuxPodSandboxConfig(security_context=cri.LinuxSandboxSecurityContext(
                namespace_options=self.namespaces())))

    def namespaces(self) -> cri.NamespaceOption:
        """The pod's network (the node's, with ``host_network``), a PID namespace per container."""
        return cri.NamespaceOption(network=cri.NODE if self.host_network else cri.POD, pid=cri.CONTAINER,
                                   ipc=cri.POD)


@dataclass(frozen=True)
class ContainerSpec:
    name: str
    image: str
    command: Sequence[str]
    env: Mapping[str, str]
    mounts: Sequence[tuple[str, str, bool]] = ()  # (host path, container path, read-only)
    working_dir: str = ""

    def config(self, pod: PodSpec) -> cri.ContainerConfig:
        """As a kubelet writes it, with the labels by which it finds a pod's containers again."""
        return cri.ContainerConfig(
            metadata=cri.ContainerMetadata(name=self.name), image=cri.ImageSpec(image=self.image),
            command=list(self.command), working_dir=self.working_dir,
            envs=[cri.KeyValue(key=k, value=v) for k, v in self.env.items()],
            mounts=[cri.Mount(host_path=h, container_path=c, readonly=ro) for h, c, ro in self.mounts],
            log_path=f"{self.name}.log",
            labels={POD_NAME_LABEL: pod.name, POD_NAMESPACE_LABEL: pod.namespace, CONTAINER_NAME_LABEL: self.name},
            linux=cri.LinuxContainerConfig(security_context=cri.LinuxContainerSecurityContext(
                namespace_options=pod.namespaces())))


@dataclass(frozen=True)
class ContainerInfo:
    id: str
    name: str
    state: str
    exit_code: int
    log_path: str
    annotations: dict[str, str]
    pid: int | None
    runc_root: str  # runc's state folder for this container (the runtime's Root, then the namespace)

    @property
    def log(self) -> Path:
        return Path(self.log_path)


def container_info(status: cri.ContainerStatusResponse) -> ContainerInfo:
    """A verbose ContainerStatus as Ferry needs it: containerd's ``info`` JSON names the runtime's
    options (its runc ``root``) and the container's pid."""
    info = json.loads(status.info.get("info", "{}") or "{}")
    options = info.get("runtimeOptions") or {}
    root = options.get("root") or DEFAULT_RUNC_ROOT
    s = status.status
    return ContainerInfo(id=s.id, name=s.metadata.name, state=STATES.get(s.state, "unknown"), exit_code=s.exit_code,
                         log_path=s.log_path, annotations=dict(s.annotations), pid=info.get("pid") or None,
                         runc_root=f"{root}/{CRI_NAMESPACE}")


class CriClient:
    """``async with CriClient("unix:///run/containerd/containerd.sock") as cri: ...``"""

    def __init__(self, endpoint: str, *, timeout: float = 60.0) -> None:
        self.endpoint = endpoint if "://" in endpoint else f"unix://{endpoint}"
        self.timeout = timeout
        self._channel = grpc.aio.insecure_channel(self.endpoint)  # a local unix socket, root only
        self._runtime = cri_grpc.RuntimeServiceStub(self._channel)

    async def __aenter__(self) -> CriClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close(grace=None)

    async def _call(self, what: str, call: Any, request: object) -> Any:
        try:
            return await call(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.NOT_FOUND:
                raise NotFoundError(f"{what}: {exc.details()}") from None
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                raise CriError(f"cannot reach containerd's CRI at {self.endpoint}: is containerd running, with its "
                               "CRI plugin? (--endpoint or FERRY_CRI_ENDPOINT names its socket)") from None
            raise CriError(f"{what} at {self.endpoint}: {exc.details() or exc.code().name}") from None

    async def version(self) -> str:
        r: cri.VersionResponse = await self._call("Version", self._runtime.Version, cri.VersionRequest(version="v1"))
        return f"{r.runtime_name} {r.runtime_version} (CRI {r.runtime_api_version})"

    async def run_pod(self, pod: PodSpec, handler: str = RUNTIME_HANDLER) -> str:
        r: cri.RunPodSandboxResponse = await self._call(
            "RunPodSandbox", self._runtime.RunPodSandbox, cri.RunPodSandboxRequest(config=pod.config(),
                                                                                   runtime_handler=handler))
        return r.pod_sandbox_id

    async def create_container(self, pod_id: str, pod: PodSpec, container: ContainerSpec) -> str:
        r: cri.CreateContainerResponse = await self._call(
            "CreateContainer", self._runtime.CreateContainer,
            cri.CreateContainerRequest(pod_sandbox_id=pod_id, config=container.config(pod),
                                       sandbox_config=pod.config()))
        return r.container_id

    async def start_container(self, container_id: str) -> None:
        await self._call("StartContainer", self._runtime.StartContainer,
                         cri.StartContainerRequest(container_id=container_id))

    async def stop_container(self, container_id: str, timeout: int = 0) -> None:
        await self._call("StopContainer", self._runtime.StopContainer,
                         cri.StopContainerRequest(container_id=container_id, timeout=timeout))

    async def remove_container(self, container_id: str) -> None:
        await self._call("RemoveContainer", self._runtime.RemoveContainer,
                         cri.RemoveContainerRequest(container_id=container_id))

    async def stop_pod(self, pod_id: str) -> None:
        await self._call("StopPodSandbox", self._runtime.StopPodSandbox,
                         cri.StopPodSandboxRequest(pod_sandbox_id=pod_id))

    async def remove_pod(self, pod_id: str) -> None:
        await self._call("RemovePodSandbox", self._runtime.RemovePodSandbox,
                         cri.RemovePodSandboxRequest(pod_sandbox_id=pod_id))

    async def pods(self) -> list[str]:
        """The ids of every pod sandbox the runtime has."""
        r: cri.ListPodSandboxResponse = await self._call("ListPodSandbox", self._runtime.ListPodSandbox,
                                                         cri.ListPodSandboxRequest())
        return [p.id for p in r.items]

    async def container(self, container_id: str) -> ContainerInfo:
        r: cri.ContainerStatusResponse = await self._call(
            "ContainerStatus", self._runtime.ContainerStatus,
            cri.ContainerStatusRequest(container_id=container_id, verbose=True))
        return container_info(r)

    async def pod_containers(self, namespace: str, pod: str) -> list[str]:
        """The containers of a pod, found by the labels its kubelet gave them."""
        r: cri.ListContainersResponse = await self._call(
            "ListContainers", self._runtime.ListContainers, cri.ListContainersRequest(filter=cri.ContainerFilter(
                label_selector={POD_NAME_LABEL: pod, POD_NAMESPACE_LABEL: namespace})))
        return [c.id for c in r.containers]

    async def containers(self, pod_id: str = "") -> list[str]:
        r: cri.ListContainersResponse = await self._call(
            "ListContainers", self._runtime.ListContainers,
            cri.ListContainersRequest(filter=cri.ContainerFilter(pod_sandbox_id=pod_id)))
        return [c.id for c in r.containers]
