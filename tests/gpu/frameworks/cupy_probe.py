# CuPy: a float32 matrix product (cuBLAS), an ElementwiseKernel and a RawKernel (both compiled by NVRTC and loaded
# through the driver), an FFT (cuFFT) and reductions, each checked against NumPy; rounded results are compared
# between the native and the vcuda run.
import os
import sys
import tempfile

# A fresh kernel cache unless the caller chose one, so that every run compiles and loads its kernels.
_cache = None
if "CUPY_CACHE_DIR" not in os.environ:
    _cache = tempfile.TemporaryDirectory(prefix="cupy-probe-")
    os.environ["CUPY_CACHE_DIR"] = _cache.name

import cupy as cp  # noqa: E402
import numpy as np  # noqa: E402

sys.stdout.reconfigure(line_buffering=True)
failures = []


def check(name, got, ref, rtol, atol):
    ok = np.allclose(got, ref, rtol=rtol, atol=atol)
    print(f"{name} matches numpy: {ok}")
    print(f"info: {name} max abs error {np.max(np.abs(np.asarray(got) - ref)):.3g}")
    if not ok:
        failures.append(name)


rng = np.random.RandomState(0)
props = cp.cuda.runtime.getDeviceProperties(0)
print("devices", cp.cuda.runtime.getDeviceCount())
print("name", props["name"].decode() if isinstance(props["name"], bytes) else props["name"])
print(f"info: cupy {cp.__version__}, CUDA runtime {cp.cuda.runtime.runtimeGetVersion()}, "
      f"driver {cp.cuda.runtime.driverGetVersion()}")

# Matrix product (float32: cuBLAS SGEMM).
a = rng.standard_normal((512, 384)).astype(np.float32)
b = rng.standard_normal((384, 256)).astype(np.float32)
c = cp.asarray(a) @ cp.asarray(b)
check("matmul", cp.asnumpy(c), a.astype(np.float64) @ b.astype(np.float64), 1e-4, 1e-3)
print(f"matmul checksum {float(c.astype(cp.float64).sum()):.3f}")

# ElementwiseKernel.
sq_add = cp.ElementwiseKernel("float32 x, float32 y", "float32 z", "z = x * x + 2.0f * y", "probe_sq_add")
x = rng.standard_normal(100_003).astype(np.float32)
y = rng.standard_normal(100_003).astype(np.float32)
gx, gy = cp.asarray(x), cp.asarray(y)
z = sq_add(gx, gy)
check("elementwise", cp.asnumpy(z), x * x + 2 * y, 1e-5, 1e-5)  # the GPU may fuse into an FMA
print(f"elementwise checksum {float(z.astype(cp.float64).sum()):.3f}")

# RawKernel from a source string.
saxpy = cp.RawKernel(r"""
extern "C" __global__ void probe_saxpy(float a, const float* x, const float* y, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + y[i];
}
""", "probe_saxpy")
out = cp.empty_like(gx)
saxpy(((x.size + 255) // 256,), (256,), (cp.float32(2.5), gx, gy, out, cp.int32(x.size)))
check("rawkernel", cp.asnumpy(out), 2.5 * x.astype(np.float64) + y, 1e-5, 1e-5)
print(f"rawkernel checksum {float(out.astype(cp.float64).sum()):.3f}")

# FFT of a fixed signal: two tones and some noise.
t = np.arange(4096) / 4096
sig = (np.sin(2 * np.pi * 50 * t) + 0.5 * np.sin(2 * np.pi * 120 * t) + 0.1 * rng.standard_normal(4096))
sig = sig.astype(np.complex64)
f = cp.asnumpy(cp.fft.fft(cp.asarray(sig)))
check("fft", f, np.fft.fft(sig.astype(np.complex128)), 1e-4, 1e-2)
print(f"fft |F[50]| {abs(f[50]):.2f} |F[120]| {abs(f[120]):.2f} peak bin {int(np.argmax(np.abs(f[:2048])))}")

# Reductions.
r = rng.standard_normal(1_000_000).astype(np.float32)
gr = cp.asarray(r)
s, m = float(gr.sum()), float(gr.max())
check("sum", s, r.astype(np.float64).sum(), 1e-5, 1e-2)
check("max", m, r.max(), 0, 0)
print(f"sum {s:.2f} max {m:.6f} argmin {int(gr.argmin())}")

cp.cuda.Device().synchronize()
if failures:
    print("FAIL cupy:", ", ".join(failures))
    sys.exit(1)
print("PASS cupy")
