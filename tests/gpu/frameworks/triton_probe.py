# Triton: a vector add, a row softmax and a float16 matmul (tl.dot) compiled by Triton, launched on PyTorch tensors
# and checked against PyTorch. Rounded checksums are compared between the native and the vcuda run.
import os
import sys
import tempfile

# A fresh kernel cache unless the caller chose one, so that every run compiles, loads and launches its kernels.
_cache = None
if "TRITON_CACHE_DIR" not in os.environ:
    _cache = tempfile.TemporaryDirectory(prefix="triton-probe-")
    os.environ["TRITON_CACHE_DIR"] = _cache.name

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

sys.stdout.reconfigure(line_buffering=True)
DEV = torch.device("cuda")
failures = []


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def softmax_kernel(out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(in_ptr + row * in_stride + offs, mask=mask, other=-float("inf"))
    num = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * out_stride + offs, num / tl.sum(num, axis=0), mask=mask)


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn,
                  BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        a = tl.load(a_ptr + rm[:, None] * sam + (k + rk)[None, :] * sak,
                    mask=(rm[:, None] < M) & ((k + rk)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (k + rk)[:, None] * sbk + rn[None, :] * sbn,
                    mask=((k + rk)[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rm[:, None] * scm + rn[None, :] * scn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def check(name, got, ref, atol, rtol):
    ok = torch.allclose(got, ref, atol=atol, rtol=rtol)
    print(f"{name} matches torch: {ok}")
    print(f"info: {name} max abs error {(got - ref).abs().max().item():.3g}")
    if not ok:
        failures.append(name)


def checksum(t):
    return t.double().sum().item()


torch.manual_seed(0)
print(f"info: triton {triton.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}")

n = 98_432  # not a multiple of the block
x, y = torch.randn(n, device=DEV), torch.randn(n, device=DEV)
out = torch.empty_like(x)
add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
check("vector add", out, x + y, 0, 0)
print(f"vector add checksum {checksum(out):.4f}")

rows, cols = 300, 781
s_in = torch.randn(rows, cols, device=DEV) * 3
s_out = torch.empty_like(s_in)
softmax_kernel[(rows,)](s_out, s_in, s_in.stride(0), s_out.stride(0), cols, BLOCK=triton.next_power_of_2(cols))
check("softmax", s_out, torch.softmax(s_in, dim=1), 1e-6, 1e-4)
print(f"softmax row sums checksum {checksum(s_out):.4f}")
print(f"softmax weighted checksum {checksum(s_out * torch.arange(cols, device=DEV)):.3f}")

M, N, K = 320, 192, 272
a = torch.randn(M, K, device=DEV, dtype=torch.float16)
b = torch.randn(K, N, device=DEV, dtype=torch.float16)
c = torch.empty(M, N, device=DEV, dtype=torch.float32)
grid = (triton.cdiv(M, 64), triton.cdiv(N, 64))
matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                    BM=64, BN=64, BK=32)
check("matmul", c, a.float() @ b.float(), 1e-2, 1e-3)
print(f"matmul checksum {checksum(c):.3f}")

torch.cuda.synchronize()
if failures:
    print("FAIL triton:", ", ".join(failures))
    sys.exit(1)
print("PASS triton")
