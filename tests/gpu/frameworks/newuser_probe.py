# What a new user tries first, written plainly (no determinism flags, no pinned memory, default allocator
# settings): the programs that once crashed vcuda-server or failed on Hopper-only calls. What they print
# (other than `info:` lines) is rounded so that a native and a vcuda run on the same GPU agree.
#
# Usage: newuser_probe.py MODE
#   torch    a conv2d, a matmul, and a small MLP trained with Adam for 50 steps
#   compile  torch.compile (Inductor, Triton kernels) of a small MLP, forward and backward
#   jax      jax.jit and jax.grad of a small model, 10 SGD steps (JAX's defaults: preallocation, autotuning)
import sys

MODES = ("torch", "compile", "jax")
MODE = sys.argv[1] if len(sys.argv) > 1 else "torch"
if MODE not in MODES:
    sys.exit(f"usage: {sys.argv[0]} {'|'.join(MODES)}")
sys.stdout.reconfigure(line_buffering=True)


def r(x, digits=3):
    """A float rounded to `digits` significant digits, as text."""
    return f"{float(x):.{digits}g}"


def run_torch():
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    dev = "cuda"
    x = torch.randn(8, 3, 32, 32, device=dev)
    conv = nn.Conv2d(3, 16, 3, padding=1).to(dev)
    y = conv(x)
    print("conv2d", tuple(y.shape), r(y.abs().mean()))
    a = torch.randn(512, 256, device=dev)
    b = torch.randn(256, 128, device=dev)
    print("matmul", tuple((a @ b).shape), r((a @ b).abs().mean()))
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.randn(256, 64, device=dev)
    target = torch.randint(0, 10, (256,), device=dev)
    for step in range(50):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(data), target)
        loss.backward()
        opt.step()
        if step % 10 == 9:
            print("adam step", step + 1, "loss", r(loss.item()))


def run_compile():
    import torch
    import torch.nn as nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256), nn.LayerNorm(256)).cuda()
    compiled = torch.compile(model)
    x = torch.randn(64, 256, device="cuda", requires_grad=True)
    out = compiled(x)
    out.square().mean().backward()
    print("compiled forward", tuple(out.shape), r(out.abs().mean()))
    print("compiled grad", r(x.grad.abs().mean()))
    ref = model(x.detach())
    print("matches eager", bool(torch.allclose(out, ref, atol=1e-4, rtol=1e-3)))


def run_jax():
    import jax
    import jax.numpy as jnp

    print(f"info: jax {jax.__version__}, devices {jax.devices()}")
    key = jax.random.PRNGKey(0)
    k1, k2, k3 = jax.random.split(key, 3)
    X = jax.random.normal(k1, (512, 64))
    Y = jax.random.normal(k2, (512, 1))
    params = {"w1": jax.random.normal(k3, (64, 128)) * 0.1, "b1": jnp.zeros(128), "w2": jnp.full((128, 1), 0.05), "b2": jnp.zeros(1)}

    def loss(p, x, y):
        h = jax.nn.relu(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] + p["b2"] - y) ** 2)

    @jax.jit
    def step(p, x, y):
        l, g = jax.value_and_grad(loss)(p, x, y)
        return jax.tree_util.tree_map(lambda a, b: a - 0.05 * b, p, g), l

    for i in range(10):
        params, l = step(params, X, Y)
        print("sgd step", i + 1, "loss", r(l))


{"torch": run_torch, "compile": run_compile, "jax": run_jax}[MODE]()
print("PASS newuser", MODE)
