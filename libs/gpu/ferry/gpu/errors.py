"""Errors raised by ``ferry.gpu``.

    FerryError                          (ferry.common.errors)
    └── GpuError                        anything that went wrong around GPUs
        ├── NvmlError                   an NVML call failed; ``call`` and NVML's ``code`` say which and why
        │   └── NvmlUnavailable         no NVML here: nvidia-ml-py or libnvidia-ml.so.1 is missing (no driver)
        ├── CudaCheckpointError         a CUDA checkpoint call failed; ``call`` and ``error_name`` say which and why
        │   └── CudaCheckpointUnavailable   no way to drive it: no cuda-python, no cuda-checkpoint, driver < 570
        └── GpuMismatch                 a GPU restore target differs from the checkpoint (also a ConflictError)

Errors from pynvml and cuda-python are translated at the boundary with ``raise ... from exc``.
Probes (``read_inventory``, the XID watcher) never raise: they report what failed instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from ferry.common.errors import ConflictError, FerryError

__all__ = [
    "CudaCheckpointError",
    "CudaCheckpointUnavailable",
    "GpuError",
    "GpuMismatch",
    "NvmlError",
    "NvmlUnavailable",
]


class GpuError(FerryError):
    """Root of the GPU domain; ``str(err)`` is one line for the user."""


class NvmlError(GpuError):
    """An NVML call failed. ``code`` is NVML's ``nvmlReturn_t`` (see ``ferry.gpu.nvml.NvmlCode``)."""

    def __init__(self, call: str, code: int | None, detail: str) -> None:
        super().__init__(f"NVML {call} failed: {detail}" + (f" (NVML error {code})" if code is not None else ""))
        self.call = call
        self.code = code
        self.detail = detail


class NvmlUnavailable(NvmlError):
    """NVML cannot be loaded here: this node has no NVIDIA driver (or no nvidia-ml-py)."""


class CudaCheckpointError(GpuError):
    """A CUDA process checkpoint call failed.

    ``call`` names it (``cuCheckpointProcessLock``, or ``cuda-checkpoint --action lock``), ``error_name`` is
    the CUDA error (``CUDA_ERROR_NOT_READY``) or the tool's message, ``pid`` the process it was about.
    """

    def __init__(self, call: str, error_name: str, pid: int | None = None, hint: str = "") -> None:
        where = f" on pid {pid}" if pid is not None else ""
        super().__init__(f"{call}{where} failed: {error_name}" + (f"; {hint}" if hint else ""))
        self.call = call
        self.error_name = error_name
        self.pid = pid


class CudaCheckpointUnavailable(CudaCheckpointError):
    """Nothing here can drive the CUDA checkpoint API (no cuda-python bindings, no cuda-checkpoint
    binary, or a driver older than 570)."""


class GpuMismatch(GpuError, ConflictError):
    """A GPU checkpoint cannot be restored on the chosen target; ``differences`` lists every reason.

    Raised before anything is touched. A ConflictError: the request is valid, the target does not fit.
    """

    def __init__(self, differences: Sequence[str]) -> None:
        self.differences = list(differences)
        super().__init__("GPU restore refused: " + "; ".join(self.differences))
