"""The setup's demo: a PyTorch training job starts on node-1, is checkpointed and stopped, is
restored on node-2, finishes there, and its output is compared with an uninterrupted run."""

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ferry.common.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TRAIN = [sys.executable, str(ROOT / "examples" / "train.py"), "--steps", "120", "--sleep", "0.03", "--width", "512"]


def ferry(*args: str) -> str:
    print(f"$ ferry {' '.join(args)}", flush=True)
    out = subprocess.run([str(BIN / "ferry"), *args], check=True, capture_output=True, text=True).stdout
    print(out.rstrip(), flush=True)
    return out


def main() -> int:
    data = Path(tempfile.mkdtemp(prefix="ferry-demo-"))
    addr = f"127.0.0.1:{free_port()}"
    os.environ["FERRY_ADDR"] = addr
    print(f"$ ferry up --nodes 2 --data-dir {data} --grpc {addr}", flush=True)
    up = subprocess.Popen([str(BIN / "ferry"), "up", "--nodes", "2", "--data-dir", str(data), "--grpc", addr],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert up.stdout is not None
        for line in up.stdout:
            print(f"  {line.rstrip()}", flush=True)
            if "ready" in line:
                break
        else:
            raise SystemExit("demo: ferry up did not become ready")
        ferry("nodes")
        ferry("run", "--name", "demo", "--node", "node-1", "--", *TRAIN)
        while subprocess.run([str(BIN / "ferry"), "logs", "demo"], capture_output=True, text=True).stdout.count(
                "\n") < 40:
            time.sleep(0.2)
        ferry("checkpoint", "demo", "--stop")
        ferry("restore", "demo", "--node", "node-2")
        ferry("wait", "demo", "--timeout", "300")
        ferry("status", "demo")
        got = subprocess.run([str(BIN / "ferry"), "logs", "demo"], capture_output=True, text=True,
                             check=True).stdout
        want = subprocess.run(TRAIN, capture_output=True, text=True, check=True).stdout
        print(f"last lines on node-2: {got.splitlines()[-2:]}")
        if got != want:
            print("demo: FAILED: the restored job's output differs from an uninterrupted run", file=sys.stderr)
            return 1
        print(f"demo: OK: the job moved from node-1 to node-2 mid-run and its {len(got.splitlines())} lines of "
              "output are identical to an uninterrupted run")
        return 0
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(timeout=30)
        except subprocess.TimeoutExpired:
            up.kill()


if __name__ == "__main__":
    sys.exit(main())
