# JAX on the CUDA plugin: a jitted MLP forward (checked against NumPy), jax.grad of its loss and a few SGD steps.
# Rounded losses are compared between the native and the vcuda run.
import os
import sys
import time

# Set before jax is imported: the GPU only (an error rather than a silent fallback to the CPU), no 75%
# preallocation, and deterministic XLA kernels (no timing-based autotuning) so that both runs compute alike.
os.environ["JAX_PLATFORMS"] = "cuda"
os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
os.environ.setdefault("XLA_FLAGS", "--xla_gpu_deterministic_ops=true")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.stdout.reconfigure(line_buffering=True)
try:
    jax.config.update("jax_default_matmul_precision", "highest")  # no TF32, so that NumPy agrees closely
except (AttributeError, ValueError) as e:
    print(f"info: jax_default_matmul_precision not set: {e}")

dev = jax.devices()[0]
assert dev.platform == "gpu", f"JAX runs on {dev.platform}, not on the GPU"
print("platform", dev.platform)
print("device_kind", dev.device_kind)
print(f"info: jax {jax.__version__}, devices {jax.devices()}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')}")

rng = np.random.RandomState(0)
X = rng.standard_normal((256, 32)).astype(np.float32)
Y = np.tanh(X @ rng.standard_normal((32, 1)).astype(np.float32)).astype(np.float32)
params = {
    "w1": (rng.standard_normal((32, 64)) * 0.2).astype(np.float32),
    "b1": np.zeros(64, np.float32),
    "w2": (rng.standard_normal((64, 1)) * 0.2).astype(np.float32),
    "b2": np.zeros(1, np.float32),
}


def forward(p, x):
    return jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def loss(p, x, y):
    return jnp.mean((forward(p, x) - y) ** 2)


@jax.jit
def sgd_step(p, x, y):
    value, grads = jax.value_and_grad(loss)(p, x, y)
    return value, jax.tree_util.tree_map(lambda w, g: w - 0.2 * g, p, grads)


failures = []
t0 = time.perf_counter()
p = jax.device_put(params, dev)
x, y = jax.device_put(X, dev), jax.device_put(Y, dev)
out = np.asarray(jax.jit(forward)(p, x))
ref = np.tanh(X.astype(np.float64) @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]
ok = np.allclose(out, ref, rtol=1e-4, atol=1e-5)
print(f"forward matches numpy: {ok}")
failures += [] if ok else ["forward"]
print(f"forward checksum {float(out.astype(np.float64).sum()):.4f}")

grads = jax.jit(jax.grad(loss))(p, x, y)
gnorm = float(jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree_util.tree_leaves(grads))))
print(f"grad norm {gnorm:.4f}")
print(f"info: forward and grad (compile included) in {(time.perf_counter() - t0) * 1e3:.0f} ms")

t0 = time.perf_counter()
losses = []
for i in range(10):
    value, p = sgd_step(p, x, y)
    losses.append(float(value))
    print(f"step {i + 1} loss {losses[-1]:.4f}")
print(f"info: 10 SGD steps in {(time.perf_counter() - t0) * 1e3:.0f} ms")
if not losses[-1] < losses[0]:
    failures.append("training did not lower the loss")

# The counter-based PRNG runs on the device too.
print(f"random checksum {float(jnp.sum(jax.random.normal(jax.random.key(0), (1000,)))):.4f}")

if failures:
    print("FAIL jax:", ", ".join(failures))
    sys.exit(1)
print("PASS jax")
