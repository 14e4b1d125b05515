from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DrainNodeRequest(_message.Message):
    __slots__ = ("node", "undo", "wait_s")
    NODE_FIELD_NUMBER: _ClassVar[int]
    UNDO_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    node: str
    undo: bool
    wait_s: float
    def __init__(self, node: _Optional[str] = ..., undo: _Optional[bool] = ..., wait_s: _Optional[float] = ...) -> None: ...

class ListPricesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Price(_message.Message):
    __slots__ = ("zone", "region", "instance_type", "market", "price_per_hour", "timestamp", "source")
    ZONE_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    MARKET_FIELD_NUMBER: _ClassVar[int]
    PRICE_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    zone: str
    region: str
    instance_type: str
    market: str
    price_per_hour: float
    timestamp: float
    source: str
    def __init__(self, zone: _Optional[str] = ..., region: _Optional[str] = ..., instance_type: _Optional[str] = ..., market: _Optional[str] = ..., price_per_hour: _Optional[float] = ..., timestamp: _Optional[float] = ..., source: _Optional[str] = ...) -> None: ...

class ListPricesResponse(_message.Message):
    __slots__ = ("prices",)
    PRICES_FIELD_NUMBER: _ClassVar[int]
    prices: _containers.RepeatedCompositeFieldContainer[Price]
    def __init__(self, prices: _Optional[_Iterable[_Union[Price, _Mapping]]] = ...) -> None: ...

class ChaosRequest(_message.Message):
    __slots__ = ("kind", "node", "in_s")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    IN_S_FIELD_NUMBER: _ClassVar[int]
    kind: str
    node: str
    in_s: float
    def __init__(self, kind: _Optional[str] = ..., node: _Optional[str] = ..., in_s: _Optional[float] = ...) -> None: ...

class ChaosResponse(_message.Message):
    __slots__ = ("node", "deadline", "message")
    NODE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    node: str
    deadline: float
    message: str
    def __init__(self, node: _Optional[str] = ..., deadline: _Optional[float] = ..., message: _Optional[str] = ...) -> None: ...

class JobRef(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...

class SubmitJobRequest(_message.Message):
    __slots__ = ("name", "argv", "env", "cwd", "node", "checkpoint_every_s", "priority", "cpus", "memory_bytes", "gpus", "deadline_s", "max_downtime_s", "gpu_model", "gpu_memory_bytes", "gpu_shared")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_EVERY_S_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    MAX_DOWNTIME_S_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_SHARED_FIELD_NUMBER: _ClassVar[int]
    name: str
    argv: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    cwd: str
    node: str
    checkpoint_every_s: float
    priority: int
    cpus: float
    memory_bytes: int
    gpus: int
    deadline_s: float
    max_downtime_s: float
    gpu_model: str
    gpu_memory_bytes: int
    gpu_shared: bool
    def __init__(self, name: _Optional[str] = ..., argv: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., cwd: _Optional[str] = ..., node: _Optional[str] = ..., checkpoint_every_s: _Optional[float] = ..., priority: _Optional[int] = ..., cpus: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., gpus: _Optional[int] = ..., deadline_s: _Optional[float] = ..., max_downtime_s: _Optional[float] = ..., gpu_model: _Optional[str] = ..., gpu_memory_bytes: _Optional[int] = ..., gpu_shared: _Optional[bool] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("all",)
    ALL_FIELD_NUMBER: _ClassVar[int]
    all: bool
    def __init__(self, all: _Optional[bool] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ...) -> None: ...

class KillJobRequest(_message.Message):
    __slots__ = ("job", "grace_s")
    JOB_FIELD_NUMBER: _ClassVar[int]
    GRACE_S_FIELD_NUMBER: _ClassVar[int]
    job: str
    grace_s: float
    def __init__(self, job: _Optional[str] = ..., grace_s: _Optional[float] = ...) -> None: ...

class WaitJobRequest(_message.Message):
    __slots__ = ("job", "timeout_s")
    JOB_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    job: str
    timeout_s: float
    def __init__(self, job: _Optional[str] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class CheckpointRequest(_message.Message):
    __slots__ = ("job", "stop")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    job: str
    stop: bool
    def __init__(self, job: _Optional[str] = ..., stop: _Optional[bool] = ...) -> None: ...

class RestoreRequest(_message.Message):
    __slots__ = ("job", "node", "checkpoint")
    JOB_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    job: str
    node: str
    checkpoint: str
    def __init__(self, job: _Optional[str] = ..., node: _Optional[str] = ..., checkpoint: _Optional[str] = ...) -> None: ...

class MigrateRequest(_message.Message):
    __slots__ = ("job", "to", "live", "tcp_established")
    JOB_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    LIVE_FIELD_NUMBER: _ClassVar[int]
    TCP_ESTABLISHED_FIELD_NUMBER: _ClassVar[int]
    job: str
    to: str
    live: bool
    tcp_established: bool
    def __init__(self, job: _Optional[str] = ..., to: _Optional[str] = ..., live: _Optional[bool] = ..., tcp_established: _Optional[bool] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[Node]
    def __init__(self, nodes: _Optional[_Iterable[_Union[Node, _Mapping]]] = ...) -> None: ...

class ListCheckpointsResponse(_message.Message):
    __slots__ = ("checkpoints",)
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    checkpoints: _containers.RepeatedCompositeFieldContainer[Checkpoint]
    def __init__(self, checkpoints: _Optional[_Iterable[_Union[Checkpoint, _Mapping]]] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: str
    def __init__(self, job: _Optional[str] = ...) -> None: ...

class ReadLogsRequest(_message.Message):
    __slots__ = ("job", "stream", "follow", "offset")
    JOB_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    job: str
    stream: str
    follow: bool
    offset: int
    def __init__(self, job: _Optional[str] = ..., stream: _Optional[str] = ..., follow: _Optional[bool] = ..., offset: _Optional[int] = ...) -> None: ...

class LogChunk(_message.Message):
    __slots__ = ("data", "offset")
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    offset: int
    def __init__(self, data: _Optional[bytes] = ..., offset: _Optional[int] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("id", "name", "argv", "env", "cwd", "state", "node", "restarts", "last_checkpoint", "has_exit_code", "exit_code", "error", "created", "updated", "checkpoint_every_s", "priority", "incarnation", "reason", "checkpoints", "cpus", "memory_bytes", "gpus", "deadline", "max_downtime_s", "gpu_model", "gpu_memory_bytes", "gpu_uuids")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGV_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    CWD_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    LAST_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    HAS_EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    UPDATED_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_EVERY_S_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    MAX_DOWNTIME_S_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_UUIDS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    argv: _containers.RepeatedScalarFieldContainer[str]
    env: _containers.ScalarMap[str, str]
    cwd: str
    state: str
    node: str
    restarts: int
    last_checkpoint: str
    has_exit_code: bool
    exit_code: int
    error: str
    created: float
    updated: float
    checkpoint_every_s: float
    priority: int
    incarnation: int
    reason: str
    checkpoints: int
    cpus: float
    memory_bytes: int
    gpus: int
    deadline: float
    max_downtime_s: float
    gpu_model: str
    gpu_memory_bytes: int
    gpu_uuids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., argv: _Optional[_Iterable[str]] = ..., env: _Optional[_Mapping[str, str]] = ..., cwd: _Optional[str] = ..., state: _Optional[str] = ..., node: _Optional[str] = ..., restarts: _Optional[int] = ..., last_checkpoint: _Optional[str] = ..., has_exit_code: _Optional[bool] = ..., exit_code: _Optional[int] = ..., error: _Optional[str] = ..., created: _Optional[float] = ..., updated: _Optional[float] = ..., checkpoint_every_s: _Optional[float] = ..., priority: _Optional[int] = ..., incarnation: _Optional[int] = ..., reason: _Optional[str] = ..., checkpoints: _Optional[int] = ..., cpus: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., gpus: _Optional[int] = ..., deadline: _Optional[float] = ..., max_downtime_s: _Optional[float] = ..., gpu_model: _Optional[str] = ..., gpu_memory_bytes: _Optional[int] = ..., gpu_uuids: _Optional[_Iterable[str]] = ...) -> None: ...

class Checkpoint(_message.Message):
    __slots__ = ("id", "job", "job_name", "parent", "node", "state", "created", "criu_version", "kernel", "bytes_logical", "bytes_stored", "bytes_uploaded", "freeze_ms", "dump_ms", "upload_ms", "total_ms", "manifest_key", "error", "log_excerpt", "final", "gpu_bytes", "gpu_lock_ms", "gpu_checkpoint_ms")
    ID_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    JOB_NAME_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    CRIU_VERSION_FIELD_NUMBER: _ClassVar[int]
    KERNEL_FIELD_NUMBER: _ClassVar[int]
    BYTES_LOGICAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_STORED_FIELD_NUMBER: _ClassVar[int]
    BYTES_UPLOADED_FIELD_NUMBER: _ClassVar[int]
    FREEZE_MS_FIELD_NUMBER: _ClassVar[int]
    DUMP_MS_FIELD_NUMBER: _ClassVar[int]
    UPLOAD_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_KEY_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LOG_EXCERPT_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    GPU_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_LOCK_MS_FIELD_NUMBER: _ClassVar[int]
    GPU_CHECKPOINT_MS_FIELD_NUMBER: _ClassVar[int]
    id: str
    job: str
    job_name: str
    parent: str
    node: str
    state: str
    created: float
    criu_version: str
    kernel: str
    bytes_logical: int
    bytes_stored: int
    bytes_uploaded: int
    freeze_ms: float
    dump_ms: float
    upload_ms: float
    total_ms: float
    manifest_key: str
    error: str
    log_excerpt: _containers.RepeatedScalarFieldContainer[str]
    final: bool
    gpu_bytes: int
    gpu_lock_ms: float
    gpu_checkpoint_ms: float
    def __init__(self, id: _Optional[str] = ..., job: _Optional[str] = ..., job_name: _Optional[str] = ..., parent: _Optional[str] = ..., node: _Optional[str] = ..., state: _Optional[str] = ..., created: _Optional[float] = ..., criu_version: _Optional[str] = ..., kernel: _Optional[str] = ..., bytes_logical: _Optional[int] = ..., bytes_stored: _Optional[int] = ..., bytes_uploaded: _Optional[int] = ..., freeze_ms: _Optional[float] = ..., dump_ms: _Optional[float] = ..., upload_ms: _Optional[float] = ..., total_ms: _Optional[float] = ..., manifest_key: _Optional[str] = ..., error: _Optional[str] = ..., log_excerpt: _Optional[_Iterable[str]] = ..., final: _Optional[bool] = ..., gpu_bytes: _Optional[int] = ..., gpu_lock_ms: _Optional[float] = ..., gpu_checkpoint_ms: _Optional[float] = ...) -> None: ...

class Node(_message.Message):
    __slots__ = ("id", "state", "criu_ok", "criu_version", "criu_error", "lazy_pages", "heartbeat", "cpus", "memory_bytes", "labels", "jobs", "address", "price_per_hour", "spot", "gpus", "preemptions", "notice_deadline", "gpu_list", "gpu_driver", "gpu_error", "gpu_conditions", "lazy_pages_error")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CRIU_OK_FIELD_NUMBER: _ClassVar[int]
    CRIU_VERSION_FIELD_NUMBER: _ClassVar[int]
    CRIU_ERROR_FIELD_NUMBER: _ClassVar[int]
    LAZY_PAGES_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    CPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PRICE_PER_HOUR_FIELD_NUMBER: _ClassVar[int]
    SPOT_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    NOTICE_DEADLINE_FIELD_NUMBER: _ClassVar[int]
    GPU_LIST_FIELD_NUMBER: _ClassVar[int]
    GPU_DRIVER_FIELD_NUMBER: _ClassVar[int]
    GPU_ERROR_FIELD_NUMBER: _ClassVar[int]
    GPU_CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    LAZY_PAGES_ERROR_FIELD_NUMBER: _ClassVar[int]
    id: str
    state: str
    criu_ok: bool
    criu_version: str
    criu_error: str
    lazy_pages: bool
    heartbeat: float
    cpus: int
    memory_bytes: int
    labels: _containers.ScalarMap[str, str]
    jobs: _containers.RepeatedScalarFieldContainer[str]
    address: str
    price_per_hour: float
    spot: bool
    gpus: int
    preemptions: int
    notice_deadline: float
    gpu_list: _containers.RepeatedCompositeFieldContainer[Gpu]
    gpu_driver: str
    gpu_error: str
    gpu_conditions: _containers.RepeatedScalarFieldContainer[str]
    lazy_pages_error: str
    def __init__(self, id: _Optional[str] = ..., state: _Optional[str] = ..., criu_ok: _Optional[bool] = ..., criu_version: _Optional[str] = ..., criu_error: _Optional[str] = ..., lazy_pages: _Optional[bool] = ..., heartbeat: _Optional[float] = ..., cpus: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., jobs: _Optional[_Iterable[str]] = ..., address: _Optional[str] = ..., price_per_hour: _Optional[float] = ..., spot: _Optional[bool] = ..., gpus: _Optional[int] = ..., preemptions: _Optional[int] = ..., notice_deadline: _Optional[float] = ..., gpu_list: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., gpu_driver: _Optional[str] = ..., gpu_error: _Optional[str] = ..., gpu_conditions: _Optional[_Iterable[str]] = ..., lazy_pages_error: _Optional[str] = ...) -> None: ...

class Gpu(_message.Message):
    __slots__ = ("index", "uuid", "model", "memory_total", "memory_used", "utilization_pct", "temperature_c", "power_w", "ecc_uncorrected", "ecc_corrected", "throttle_reasons", "xid_events", "healthy", "problems", "lost", "pci_bus_id")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_PCT_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    POWER_W_FIELD_NUMBER: _ClassVar[int]
    ECC_UNCORRECTED_FIELD_NUMBER: _ClassVar[int]
    ECC_CORRECTED_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_REASONS_FIELD_NUMBER: _ClassVar[int]
    XID_EVENTS_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    model: str
    memory_total: int
    memory_used: int
    utilization_pct: int
    temperature_c: int
    power_w: float
    ecc_uncorrected: int
    ecc_corrected: int
    throttle_reasons: _containers.RepeatedScalarFieldContainer[str]
    xid_events: _containers.RepeatedScalarFieldContainer[int]
    healthy: bool
    problems: _containers.RepeatedScalarFieldContainer[str]
    lost: bool
    pci_bus_id: str
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., model: _Optional[str] = ..., memory_total: _Optional[int] = ..., memory_used: _Optional[int] = ..., utilization_pct: _Optional[int] = ..., temperature_c: _Optional[int] = ..., power_w: _Optional[float] = ..., ecc_uncorrected: _Optional[int] = ..., ecc_corrected: _Optional[int] = ..., throttle_reasons: _Optional[_Iterable[str]] = ..., xid_events: _Optional[_Iterable[int]] = ..., healthy: _Optional[bool] = ..., problems: _Optional[_Iterable[str]] = ..., lost: _Optional[bool] = ..., pci_bus_id: _Optional[str] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("id", "kind", "job", "node", "time", "message", "data_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    kind: str
    job: str
    node: str
    time: float
    message: str
    data_json: str
    def __init__(self, id: _Optional[str] = ..., kind: _Optional[str] = ..., job: _Optional[str] = ..., node: _Optional[str] = ..., time: _Optional[float] = ..., message: _Optional[str] = ..., data_json: _Optional[str] = ...) -> None: ...

class OpUpdate(_message.Message):
    __slots__ = ("op", "phase", "done_bytes", "total_bytes", "done", "error", "error_code", "checkpoint", "job", "restore_ms", "total_ms", "result_json", "error_kind")
    OP_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    DONE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    RESTORE_MS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    RESULT_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_KIND_FIELD_NUMBER: _ClassVar[int]
    op: str
    phase: str
    done_bytes: int
    total_bytes: int
    done: bool
    error: str
    error_code: int
    checkpoint: Checkpoint
    job: Job
    restore_ms: float
    total_ms: float
    result_json: str
    error_kind: str
    def __init__(self, op: _Optional[str] = ..., phase: _Optional[str] = ..., done_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., done: _Optional[bool] = ..., error: _Optional[str] = ..., error_code: _Optional[int] = ..., checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ..., job: _Optional[_Union[Job, _Mapping]] = ..., restore_ms: _Optional[float] = ..., total_ms: _Optional[float] = ..., result_json: _Optional[str] = ..., error_kind: _Optional[str] = ...) -> None: ...
