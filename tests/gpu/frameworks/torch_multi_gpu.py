# PyTorch on two GPUs, deterministic; what it prints (lines other than `info:`) must be the same natively and
# through vcuda. Needs two visible GPUs: with fewer it says so and exits 1 (never a pass).
#
# Usage: torch_multi_gpu.py MODE
#   ddp     a DistributedDataParallel training step loop with two processes, one per GPU, over NCCL (the
#           processes meet through a file in a temporary folder); each rank trains on its own shard, the
#           gradients are all-reduced; rank 0 prints the loss every 5 steps and a digest of the weights, rank 1
#           checks that its weights equal rank 0's
#   copies  one process: tensors made on cuda:0 and copied to cuda:1 and back (device to device, with and without
#           peer access as the driver allows), a matrix product on each GPU, results compared on the host
import os
import sys
import tempfile

MODES = ("ddp", "copies")
MODE = sys.argv[1] if len(sys.argv) > 1 else "ddp"
if MODE not in MODES:
    sys.exit(f"usage: {sys.argv[0]} {'|'.join(MODES)}")
os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
# NVLink multicast stays off on the lent machines (KINDS.md): keep it off in every child too.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402

sys.stdout.reconfigure(line_buffering=True)
STEPS = 20


def digest(model):
    """The weights' sum and sum of squares in float64: equal weights print equal digests."""
    flat = torch.cat([p.detach().double().flatten().cpu() for p in model.parameters()])
    return f"{flat.sum().item():.10e} {(flat * flat).sum().item():.10e}"


def ddp_worker(rank, world, init_file):
    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world)
    dev = torch.device("cuda", rank)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).to(dev)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own shard
    xs = torch.randn(STEPS, 128, 64, generator=g)
    ys = torch.randint(0, 10, (STEPS, 128), generator=g)
    for step in range(STEPS):
        x, y = xs[step].to(dev), ys[step].to(dev)
        loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        lt = loss.detach().clone()
        dist.all_reduce(lt)
        if rank == 0 and step % 5 == 4:
            print(f"step {step + 1}: mean loss {lt.item() / world:.6f}")
    mine = digest(model)
    theirs = [None] * world
    dist.all_gather_object(theirs, mine)
    if rank == 0:
        print(f"weights digest: {mine}")
        print("ranks agree" if all(t == mine for t in theirs) else f"RANKS DIFFER: {theirs}")
    dist.barrier()
    dist.destroy_process_group()


def run_ddp():
    with tempfile.TemporaryDirectory() as d:
        mp.spawn(ddp_worker, args=(2, os.path.join(d, "init")), nprocs=2, join=True)
    print("PASS torch_multi_gpu ddp")


def run_copies():
    d0, d1 = torch.device("cuda", 0), torch.device("cuda", 1)
    # info: across two servers the devices are no peers, natively on one host they are: the results must not differ.
    print(f"info: peer access 0->1: {torch.cuda.can_device_access_peer(0, 1)}, 1->0: {torch.cuda.can_device_access_peer(1, 0)}")
    g = torch.Generator().manual_seed(7)
    host_a = torch.randn(1024, 1024, generator=g)
    host_b = torch.randn(1024, 1024, generator=g)
    a0, b0 = host_a.to(d0), host_b.to(d0)
    a1 = a0.to(d1)  # device to device
    b1 = b0.to(d1, non_blocking=True)
    torch.cuda.synchronize(d1)
    ok = torch.equal(a1.cpu(), host_a) and torch.equal(b1.cpu(), host_b)
    print(f"cuda:0 -> cuda:1 copies exact: {ok}")
    c0 = (a0 @ b0).double()
    c1 = (a1 @ b1).double()
    back = c1.to(d0)
    print(f"product on each GPU: sums {c0.sum().item():.6e} {c1.sum().item():.6e}; "
          f"max difference {(back - c0).abs().max().item():.3e}")
    big = torch.arange(64 << 20, dtype=torch.int32, device=d1)  # 256 MiB
    round_trip = big.to(d0).to(d1)
    print(f"256 MiB round trip exact: {torch.equal(round_trip, big)}")
    streams = [torch.cuda.Stream(d0), torch.cuda.Stream(d1)]
    outs = []
    for s, dev in zip(streams, (d0, d1)):
        with torch.cuda.stream(s):
            outs.append(torch.full((4096,), float(dev.index + 1), device=dev).cumsum(0))
    for s in streams:
        s.synchronize()
    print(f"per-device streams: {outs[0][-1].item():.1f} {outs[1][-1].item():.1f}")
    if ok and torch.equal(round_trip, big):
        print("PASS torch_multi_gpu copies")


if __name__ == "__main__":
    n = torch.cuda.device_count()
    print(f"devices: {n}")
    if n < 2:
        sys.exit("torch_multi_gpu: needs two visible GPUs")
    run_ddp() if MODE == "ddp" else run_copies()
