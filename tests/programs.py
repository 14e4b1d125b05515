"""Small workloads the tests run as Ferry jobs, as `python -c` programs."""


def tcp_pair(port: int, messages: int | None = None) -> str:
    """A server and a client (forked) on one TCP connection over loopback: the client sends n, the
    server answers n+1, the client prints it: 1, 2, 3... (to `messages`, then both exit; forever
    without). The count is unbroken only if the connection lost or repeated no message."""
    until = f"n < {messages}" if messages else "True"
    return f"""
import os, socket, sys, time
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", {port}))
srv.listen(1)
if os.fork() == 0:
    c = socket.create_connection(("127.0.0.1", {port}))
    n = 0
    while {until}:
        c.sendall(b"%d\\n" % n)
        n = int(c.recv(64))
        print(n, flush=True)
        time.sleep(0.02)
    sys.exit(0)
conn, _ = srv.accept()
while got := conn.recv(64):
    conn.sendall(b"%d" % (int(got) + 1))
os.wait()
"""


def udp_and_unix(port: int) -> str:
    """A UDP socket on 127.0.0.1:`port` and a unix socket pair between a parent and its child:
    each second line the child asks over the pair, the parent answers over UDP to itself and
    prints `n udp unix`: unbroken only if both kinds of socket came through. CRIU carries a UDP
    socket but not the datagrams queued on it (a unix socket's queue it does carry), so the parent
    sends again when no answer comes, as any UDP program must."""
    return f"""
import os, socket, time
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind(("127.0.0.1", {port}))
mine, theirs = socket.socketpair()
if os.fork() == 0:
    mine.close()
    n = 0
    while True:
        theirs.sendall(b"%d\\n" % n)
        n = int(theirs.recv(64)) + 1
        time.sleep(0.02)
theirs.close()
udp.settimeout(0.5)
while True:
    n = int(mine.recv(64))
    got = -1
    while got != n:
        udp.sendto(b"%d" % n, ("127.0.0.1", {port}))
        try:
            got = int(udp.recv(64))
        except TimeoutError:
            pass
    print(got, "udp", "unix", flush=True)
    mine.sendall(b"%d" % got)
"""


def tcp_answer_server(port: int) -> str:
    """A TCP server on every address of the job, port `port`: to each client (a thread each) it
    answers n with n+1, and prints each peer's address as it comes."""
    return f"""
import socket, threading
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", {port}))
srv.listen(16)
def serve(conn):
    while got := conn.recv(64):
        conn.sendall(b"%d" % (int(got) + 1))
while True:
    conn, peer = srv.accept()
    print("peer", peer[0], flush=True)
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
"""


def tcp_counter_client(host: str, port: int, messages: int) -> str:
    """One TCP connection to `host`:`port` (a `tcp_answer_server`): sends n, prints the answer,
    1..`messages`, then exits. The count is unbroken only if the connection lost or repeated nothing."""
    return f"""
import socket, time
c = socket.create_connection(({host!r}, {port}), timeout=120)
n = 0
while n < {messages}:
    c.sendall(b"%d" % n)
    n = int(c.recv(64))
    print(n, flush=True)
    time.sleep(0.02)
"""


def ddp_train(steps: int, sleep: float) -> str:
    """A small deterministic data-parallel training loop for `torchrun` (gloo, CPU): each rank
    trains on its own shard, gradients are averaged over TCP every step, rank 0 prints
    "<step> <loss>" with every digit of the loss. The same ranks give the same lines, however the
    ranks are spread over nodes, so a run moved midway can be compared with one that never stopped."""
    return f"""
import os, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
gen = torch.Generator().manual_seed(1 + rank)
inputs, labels = torch.randn(1024, 64, generator=gen), torch.randint(0, 4, (1024,), generator=gen)
for step in range(1, {steps} + 1):
    idx = torch.randint(0, 1024, (64,), generator=gen)
    loss = torch.nn.functional.cross_entropy(model(inputs[idx]), labels[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    if rank == 0:
        print(step, repr((mean / world).item()), flush=True)
    time.sleep({sleep})
dist.destroy_process_group()
"""
