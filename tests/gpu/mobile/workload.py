# A training program with a pause in the middle, for moving, suspending and draining its session while it runs
# (tests/gpu/mobile/run_mobile.sh acts during the pause). Deterministic: what it prints (lines other than
# `info:`) must be the same natively and through vcuda, moved or not.
#
# Usage: workload.py KIND PAUSE_SECONDS
#   cnn          PyTorch: a small CNN, SGD, 20 + 20 steps
#   transformer  PyTorch: a 2-layer transformer encoder, AdamW, 20 + 20 steps
#   cupy         CuPy: a least-squares fit by gradient descent with an ElementwiseKernel, 200 + 200 steps
#   jax          JAX: jit + grad of a small MLP, 50 + 50 steps
# Prints `phase 1 done` (the orchestrator's cue), pauses, runs phase 2, prints `PASS workload`. The pause lasts
# PAUSE_SECONDS, or less when MOBILE_GO_FILE names a file: until it exists (the orchestrator made it once its
# action was done, so that a workload quicker than the others is still in its pause when the action comes).
import os
import sys
import time

KIND = sys.argv[1] if len(sys.argv) > 1 else "cnn"
PAUSE = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
GO = os.environ.get("MOBILE_GO_FILE", "")
sys.stdout.reconfigure(line_buffering=True)


def pause():
    print("phase 1 done", flush=True)
    end = time.monotonic() + PAUSE
    while time.monotonic() < end and not (GO and os.path.exists(GO)):
        time.sleep(0.05)


if KIND in ("cnn", "transformer"):
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    dev = torch.device("cuda")
    if KIND == "cnn":
        model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                              nn.Flatten(), nn.Linear(32, 10)).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        x = torch.randn(64, 3, 32, 32, device=dev)
        y = torch.randint(0, 10, (64,), device=dev)
        loss_of = lambda: F.cross_entropy(model(x), y)  # noqa: E731
    else:
        layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, dropout=0.0,
                                           batch_first=True)
        model = nn.Sequential(nn.TransformerEncoder(layer, num_layers=2), nn.Flatten(), nn.Linear(16 * 64, 10)).to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(32, 16, 64, device=dev)
        y = torch.randint(0, 10, (32,), device=dev)
        loss_of = lambda: F.cross_entropy(model(x), y)  # noqa: E731

    def steps(first, n):
        for i in range(first, first + n):
            opt.zero_grad()
            loss = loss_of()
            loss.backward()
            opt.step()
            if (i + 1) % 5 == 0:
                print(f"step {i + 1} loss {loss.item():.5f}")

    steps(0, 20)
    pause()
    steps(20, 20)
    print(f"weights checksum {sum(p.double().sum().item() for p in model.parameters()):.6f}")
elif KIND == "cupy":
    import cupy as cp

    rng = cp.random.RandomState(0)
    a = rng.standard_normal((4096, 64), dtype=cp.float64)
    truth = cp.arange(64, dtype=cp.float64) / 64
    b = a @ truth
    w = cp.zeros(64, dtype=cp.float64)
    step = cp.ElementwiseKernel("float64 w, float64 g, float64 lr", "float64 out", "out = w - lr * g", "gd_step")

    def steps(first, n):
        global w
        for i in range(first, first + n):
            g = a.T @ (a @ w - b) / a.shape[0]
            w = step(w, g, 0.5)
            if (i + 1) % 50 == 0:
                print(f"step {i + 1} residual {float(cp.linalg.norm(a @ w - b)):.8f}")

    steps(0, 200)
    pause()
    steps(200, 200)
    print(f"error {float(cp.abs(w - truth).max()):.8f}")
elif KIND == "jax":
    os.environ["JAX_PLATFORMS"] = "cuda"
    os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    os.environ.setdefault("XLA_FLAGS", "--xla_gpu_deterministic_ops=true")
    import jax
    import jax.numpy as jnp

    key = jax.random.PRNGKey(0)
    k1, k2, k3 = jax.random.split(key, 3)
    x = jax.random.normal(k1, (256, 32))
    y = jnp.sin(x.sum(axis=1, keepdims=True))
    params = {"w1": jax.random.normal(k2, (32, 64)) * 0.1, "w2": jax.random.normal(k3, (64, 1)) * 0.1}

    def loss_fn(p):
        return jnp.mean((jnp.tanh(x @ p["w1"]) @ p["w2"] - y) ** 2)

    @jax.jit
    def update(p):
        loss, g = jax.value_and_grad(loss_fn)(p)
        return jax.tree_util.tree_map(lambda a, b: a - 0.1 * b, p, g), loss

    def steps(first, n):
        global params
        for i in range(first, first + n):
            params, loss = update(params)
            if (i + 1) % 10 == 0:
                print(f"step {i + 1} loss {float(loss):.6f}")

    steps(0, 50)
    pause()
    steps(50, 50)
else:
    sys.exit(f"usage: {sys.argv[0]} cnn|transformer|cupy|jax PAUSE_SECONDS")
print("PASS workload")
