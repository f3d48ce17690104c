# Trains a small CNN deterministically on fixed synthetic data; what it prints (lines other than `info:`) must be
# the same natively and through vcuda on the same GPU.
#
# Usage: torch_train.py MODE
#   plain       60 SGD steps, inputs copied each step from pinned memory with non_blocking=True; loss every 10
#   expandable  the same under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the driver's VMM calls)
#   graph       one whole training step captured with torch.cuda.graph, replayed 30 times on new data
#   autocast    float16 autocast with a GradScaler; losses to 2 decimals
#   queries     device count, name, capability, mem_get_info, the caching allocator's figures
#   step_time   info: step_ms over 200 steps (and vcuda's sync round trips per step, when vcuda_counters can)
import os
import sys
import time

MODES = ("plain", "expandable", "graph", "autocast", "queries", "step_time")
MODE = sys.argv[1] if len(sys.argv) > 1 else "plain"
if MODE not in MODES:
    sys.exit(f"usage: {sys.argv[0]} {'|'.join(MODES)}")
# Both are read when cuBLAS and the allocator initialise: set them before torch is imported.
os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
if MODE == "expandable":
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.stdout.reconfigure(line_buffering=True)  # keep what was printed if the process dies
torch.manual_seed(0)
torch.use_deterministic_algorithms(True)
torch.backends.cudnn.deterministic = True
torch.backends.cudnn.benchmark = False

DEV = torch.device("cuda")
BATCH, CLASSES, NBATCHES = 64, 10, 8


def make_model():
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),   # 32x32 -> 16x16
        nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),  # -> 8x8
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),  # -> 4x4
        nn.Flatten(), nn.Linear(64 * 4 * 4, 128), nn.ReLU(), nn.Linear(128, CLASSES),
    ).to(DEV)


def make_data():
    """NBATCHES batches in pinned host memory; each class adds its own pattern so that there is something to learn."""
    g = torch.Generator().manual_seed(1)
    patterns = torch.randn(CLASSES, 3, 32, 32, generator=g)
    labels = torch.randint(0, CLASSES, (NBATCHES, BATCH), generator=g)
    xs = torch.randn(NBATCHES, BATCH, 3, 32, 32, generator=g) + patterns[labels]
    # One-hot targets: the loss below avoids nll_loss, whose CUDA backward may refuse deterministic mode.
    ts = F.one_hot(labels, CLASSES).float()
    return [x.pin_memory() for x in xs], [t.pin_memory() for t in ts]


def loss_fn(out, target):
    return -(F.log_softmax(out.float(), dim=1) * target).sum(dim=1).mean()


def setup():
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    return model, opt


def batch(xs, ts, i):
    return xs[i % NBATCHES].to(DEV, non_blocking=True), ts[i % NBATCHES].to(DEV, non_blocking=True)


def step(model, opt, x, t, scaler=None):
    opt.zero_grad(set_to_none=True)
    if scaler is None:
        loss = loss_fn(model(x), t)
        loss.backward()
        opt.step()
    else:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = loss_fn(model(x), t)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return loss


def train(steps=60, scaler=None, digits=4):
    xs, ts = make_data()
    model, opt = setup()
    t0 = time.perf_counter()
    for i in range(steps):
        loss = step(model, opt, *batch(xs, ts, i), scaler=scaler)
        if (i + 1) % 10 == 0:
            print(f"step {i + 1} loss {loss.item():.{digits}f}")
    torch.cuda.synchronize()
    print(f"info: {steps} steps in {(time.perf_counter() - t0) * 1e3:.1f} ms")
    if scaler is not None:
        print(f"grad scale {scaler.get_scale():g}")
    print(f"info: max_memory_reserved={torch.cuda.max_memory_reserved()}")


def graph(replays=30):
    """Whole-network capture as in the PyTorch CUDA graphs notes: warm up on a side stream, capture, replay."""
    xs, ts = make_data()
    model, opt = setup()
    static_x = torch.empty(BATCH, 3, 32, 32, device=DEV)
    static_t = torch.empty(BATCH, CLASSES, device=DEV)
    static_x.copy_(xs[0], non_blocking=True)
    static_t.copy_(ts[0], non_blocking=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step(model, opt, static_x, static_t)
    torch.cuda.current_stream().wait_stream(s)

    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        static_loss = loss_fn(model(static_x), static_t)
        static_loss.backward()
        opt.step()
    print("captured one training step")

    t0 = time.perf_counter()
    for i in range(replays):
        static_x.copy_(xs[(i + 1) % NBATCHES], non_blocking=True)
        static_t.copy_(ts[(i + 1) % NBATCHES], non_blocking=True)
        g.replay()
        if (i + 1) % 5 == 0:
            print(f"replay {i + 1} loss {static_loss.item():.4f}")
    torch.cuda.synchronize()
    print(f"info: {replays} replays in {(time.perf_counter() - t0) * 1e3:.1f} ms")


def queries():
    print("device_count", torch.cuda.device_count())
    print("name", torch.cuda.get_device_name(0))
    print("capability", torch.cuda.get_device_capability(0))
    p = torch.cuda.get_device_properties(0)
    print("multiprocessors", p.multi_processor_count)
    print(f"info: total_memory={p.total_memory} (vcuda may report its quota)")
    free, total = torch.cuda.mem_get_info()
    print("mem_get_info free <= total:", "yes" if 0 < free <= total else "no")
    print(f"info: mem_get_info free={free} total={total}")
    a = torch.empty(64 << 20, dtype=torch.uint8, device=DEV)
    print("memory_allocated after 64 MiB", torch.cuda.memory_allocated())
    b = torch.empty(32 << 20, dtype=torch.uint8, device=DEV)
    del b  # the peak keeps it; the cache keeps its segment
    print("max_memory_allocated", torch.cuda.max_memory_allocated())
    print("memory_allocated", torch.cuda.memory_allocated())
    print("memory_reserved", torch.cuda.memory_reserved())
    free2, _ = torch.cuda.mem_get_info()
    print(f"info: free went down by {free - free2} bytes")
    torch.cuda.synchronize()
    print("synchronize ok", a.numel())


def step_time(warmup=20, timed=200, counted=20):
    import vcuda_counters  # beside this file

    xs, ts = make_data()
    model, opt = setup()
    i = 0
    for _ in range(warmup):
        step(model, opt, *batch(xs, ts, i))
        i += 1
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(timed):
        step(model, opt, *batch(xs, ts, i))
        i += 1
    torch.cuda.synchronize()
    print(f"info: step_ms={(time.perf_counter() - t0) * 1e3 / timed:.3f}")
    # Counted steps run natively too, so that the final loss stays comparable. The closing synchronize adds one
    # round trip over the whole window.
    c0 = vcuda_counters.read()
    for _ in range(counted):
        loss = step(model, opt, *batch(xs, ts, i))
        i += 1
    torch.cuda.synchronize()
    c1 = vcuda_counters.read()
    if c0 is not None and c1 is not None:
        print(f"info: sync_round_trips_per_step={(c1[0] - c0[0]) / counted:.2f}")
        print(f"info: async_calls_per_step={(c1[1] - c0[1]) / counted:.2f}")
    else:
        print("info: sync_round_trips_per_step=unavailable")
    print(f"after {i} steps loss {loss.item():.4f}")


if MODE in ("plain", "expandable"):
    train()
elif MODE == "autocast":
    train(scaler=torch.amp.GradScaler("cuda"), digits=2)
elif MODE == "graph":
    graph()
elif MODE == "queries":
    queries()
else:
    step_time()
print(f"PASS torch_{MODE}")
