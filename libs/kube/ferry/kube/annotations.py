"""The annotations by which a pod opts in to Ferry, and what their values mean.

A pod opts in with ``spec.runtimeClassName: ferry`` (the RuntimeClass whose handler is the
``ferry`` runtime) and, for periodic checkpoints, ``ferry.dev/checkpoint-every``. A pod created
with ``ferry.dev/restore-from: JOB/CHECKPOINT`` (or ``JOB`` for its newest checkpoint) has its
containers restored from that checkpoint in Ferry's store instead of started fresh. containerd
passes pod annotations matching ``ferry.dev/*`` into each container's OCI spec (the runtime's
``pod_annotations``), which is where the runtime reads them.
"""

from __future__ import annotations

import re

from pydantic import BaseModel

from ferry.common.errors import UsageError

PREFIX = "ferry.dev/"
RUNTIME_HANDLER = "ferry"
RESTORE_FROM = PREFIX + "restore-from"
# restore-from: auto, for pods that a workload's controller recreates (a Job after Kueue readmits
# it, a PyTorchJob resumed, a StatefulSet's pod after a drain): continue from the container job's
# newest final checkpoint that no container has continued from yet, else start fresh
AUTO = "auto"
CHECKPOINT_EVERY = PREFIX + "checkpoint-every"
JOB = PREFIX + "job"  # a container's job id in the store, when the pod names it (else job_for())
# "true": when the kubelet stops the container (SIGTERM), the runtime checkpoints it instead, so that
# the container ends with a final checkpoint that a replacement pod restores from
CHECKPOINT_ON_STOP = PREFIX + "checkpoint-on-stop"
# the pods of one distributed job, checkpointed together as they stop (ferry.kube.groups): the
# group's name, its number of pods, and how long a stopping member waits for the others
GROUP = PREFIX + "group"
GROUP_SIZE = PREFIX + "group-size"
GROUP_WAIT = PREFIX + "group-wait"
# set by containerd's CRI plugin in every container's spec
CRI_CONTAINER_TYPE = "io.kubernetes.cri.container-type"
CRI_CONTAINER_NAME = "io.kubernetes.cri.container-name"
CRI_POD_NAME = "io.kubernetes.cri.sandbox-name"
CRI_POD_NAMESPACE = "io.kubernetes.cri.sandbox-namespace"
CRI_POD_UID = "io.kubernetes.cri.sandbox-uid"
# an Indexed Job's pods carry their index; ferry.dev/job may use it as {index}
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class CheckpointRef(BaseModel):
    """A checkpoint in Ferry's store: a job's (and of it, ``checkpoint`` or else the newest)."""

    job: str
    checkpoint: str | None = None

    def __str__(self) -> str:
        return f"{self.job}/{self.checkpoint}" if self.checkpoint else self.job


def parse_restore_from(value: str) -> CheckpointRef:
    """``JOB`` or ``JOB/CHECKPOINT``; UsageError with what is wrong otherwise."""
    job, sep, checkpoint = value.strip().partition("/")
    if not _ID.match(job) or (sep and not _ID.match(checkpoint)):
        raise UsageError(f"{RESTORE_FROM}: {value!r} is not JOB or JOB/CHECKPOINT (letters, digits, '.', '_', '-')")
    return CheckpointRef(job=job, checkpoint=checkpoint or None)


def job_of(annotations: dict[str, str], fallback_container: str = "main") -> str:
    """The store's job id of a container from its OCI spec's annotations: the pod's ``ferry.dev/job``
    (``{index}`` in it: an Indexed Job's completion index), else ``job_for`` of the pod's names."""
    named = annotations.get(JOB)
    if named:
        return named.replace("{index}", annotations.get(COMPLETION_INDEX, "0"))
    return job_for(annotations.get(CRI_POD_NAMESPACE, "default"),
                                           annotations.get(CRI_POD_NAME, "pod"),
                                           annotations.get(CRI_CONTAINER_NAME, fallback_container))


def is_true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("true", "yes", "1", "on")


def job_for(namespace: str, pod: str, container: str) -> str:
    """The store's job id of a pod's container when the pod names none: stable across the pod's
    replacements, which keep their namespace, name and container names."""
    raw = f"k8s.{namespace}.{pod}.{container}"
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", raw)
    return cleaned[:128]
