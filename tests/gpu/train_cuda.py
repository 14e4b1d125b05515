"""A small, deterministic PyTorch training loop on a CUDA GPU: a GPU workload to checkpoint and move.

Prints one line per step, "<step> <loss>", and finally "done <checksum of the weights> <checksum of
the held buffer>". Run twice with the same arguments on the same GPU model it prints the same lines,
so a run that was checkpointed and restored midway can be compared line by line with one that never
stopped. ``--hold-mib`` keeps an extra buffer of that size in device memory, filled once at the
start and summed at the end, so that the checkpoint carries a known amount of GPU memory and any
byte lost on the way shows in the last line.

    python train_cuda.py [--steps 300] [--sleep 0.02] [--width 2048] [--hold-mib 512]
"""

import argparse
import os
import sys
import time

# cuBLAS is deterministic only with a fixed workspace; it must be set before CUDA starts.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--sleep", type=float, default=0.02)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--hold-mib", type=int, default=512)
    args = parser.parse_args()

    if not torch.cuda.is_available():
        sys.exit("train_cuda.py: no CUDA device (is this a CUDA build of torch, and is a GPU visible?)")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.set_num_threads(1)
    torch.manual_seed(0)
    device = torch.device("cuda")

    model = torch.nn.Sequential(
        torch.nn.Linear(512, args.width), torch.nn.ReLU(), torch.nn.Linear(args.width, 10)
    ).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    inputs = torch.randn(4096, 512).to(device)
    labels = torch.randint(0, 10, (4096,)).to(device)
    batches = torch.Generator().manual_seed(1)  # batch order from the CPU: its state is host memory
    held = torch.rand(args.hold_mib * (1 << 20) // 4, generator=torch.Generator().manual_seed(2)).to(device)

    for step in range(1, args.steps + 1):
        batch = torch.randint(0, 4096, (256,), generator=batches).to(device)
        loss = torch.nn.functional.cross_entropy(model(inputs[batch]), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(step, f"{loss.item():.6f}", flush=True)
        time.sleep(args.sleep)

    checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
    print("done", f"{checksum:.10f}", f"{float(held.double().sum()):.6f}", flush=True)


if __name__ == "__main__":
    main()
