// mapped_memory: zero-copy host memory (cudaHostAllocMapped): a kernel reads the host pages through the
// device pointer cudaHostGetDevicePointer gives and writes its results into other host pages, which the host
// reads after a synchronize, with no cudaMemcpy at all; then pinned copies from and into such memory. Through
// vcuda over a Unix socket the pages are shared with the server; over TCP the allocation is managed memory of
// the session (client/api_memory.cpp). Were cudaHostGetDevicePointer refused (cudaErrorNotSupported), the
// program would report that as its one line and stop (exit 3).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "common.cuh"

extern "C" __global__ void mm_square_plus(const unsigned* in, unsigned* out, int n, unsigned k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * in[i] + k;
}

// A driver entry point (the program is a runtime one; the copies below are the driver's own forms).
void* driver_entry(const char* name) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CHECK(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !fn) fail("%s: no driver entry point", name);
    return fn;
}

// `mapped_memory pinned`: pinned memory allocated without the mapped flag, its host pointer given to a kernel
// as it is (unified addressing makes it the device's too), as PyTorch's cholesky_inverse and XLA's autotuner
// do: a kernel reads one such buffer into device memory, another writes into a second (cudaMallocHost) that
// the CPU reads after a synchronize, and the CPU's writes between launches reach the next one. Through vcuda
// over TCP the kernels run on device copies of the buffers (client/api_launch.cpp).
int pinned_pointer_in_kernel() {
    const int n = 4096;
    unsigned *in = nullptr, *out = nullptr, *dev = nullptr;
    CHECK(cudaHostAlloc(&in, n * sizeof(unsigned), cudaHostAllocPortable));
    CHECK(cudaMallocHost(&out, n * sizeof(unsigned)));
    CHECK(cudaMalloc(&dev, n * sizeof(unsigned)));
    for (int round = 0; round < 3; ++round) {
        for (int i = 0; i < n; ++i) in[i] = static_cast<unsigned>(3 * i + round);
        mm_square_plus<<<(n + 255) / 256, 256>>>(in, dev, n, 5);
        CHECK(cudaGetLastError());
        mm_square_plus<<<(n + 255) / 256, 256>>>(dev, out, n, 1);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        std::vector<unsigned> back(n);
        CHECK(cudaMemcpy(back.data(), dev, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
        for (int i = 0; i < n; ++i) {
            if (back[i] != in[i] * in[i] + 5) fail("pinned input, round %d: word %d = %u", round, i, back[i]);
            if (out[i] != back[i] * back[i] + 1)
                fail("pinned output, round %d: word %d = %u", round, i, out[i]);
        }
    }
    std::printf("kernels read and wrote pinned host memory through its host pointer: ok\n");

    // Copies that name such memory as device memory (unified addressing: its device pointer is its host
    // pointer), as XLA reads the counter its redzone kernel writes: from it "device to host", into it "host
    // to device", and from it to device memory.
    auto dtoh = reinterpret_cast<decltype(&::cuMemcpyDtoH_v2)>(driver_entry("cuMemcpyDtoH"));
    auto htod = reinterpret_cast<decltype(&::cuMemcpyHtoD_v2)>(driver_entry("cuMemcpyHtoD"));
    auto dtod = reinterpret_cast<decltype(&::cuMemcpyDtoDAsync_v2)>(driver_entry("cuMemcpyDtoDAsync"));
    std::vector<unsigned> seen(n), given(n);
    if (dtoh(seen.data(), reinterpret_cast<CUdeviceptr>(out), n * sizeof(unsigned)) != CUDA_SUCCESS)
        fail("cuMemcpyDtoH from pinned memory by its device pointer");
    for (int i = 0; i < n; ++i) {
        if (seen[i] != out[i])
            fail("copied from pinned memory: word %d = %u, expected %u", i, seen[i], out[i]);
        given[i] = static_cast<unsigned>(7 * i + 1);
    }
    if (htod(reinterpret_cast<CUdeviceptr>(in), given.data(), n * sizeof(unsigned)) != CUDA_SUCCESS)
        fail("cuMemcpyHtoD into pinned memory by its device pointer");
    for (int i = 0; i < n; ++i)
        if (in[i] != given[i])
            fail("copied into pinned memory: word %d = %u, expected %u", i, in[i], given[i]);
    if (dtod(reinterpret_cast<CUdeviceptr>(dev), reinterpret_cast<CUdeviceptr>(in), n * sizeof(unsigned),
             nullptr) != CUDA_SUCCESS)
        fail("cuMemcpyDtoDAsync from pinned memory by its device pointer");
    std::vector<unsigned> back(n);
    CHECK(cudaMemcpy(back.data(), dev, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i)
        if (back[i] != given[i])
            fail("pinned to device memory: word %d = %u, expected %u", i, back[i], given[i]);
    std::printf("copies naming pinned host memory by its device pointer: ok\n");
    CHECK(cudaFree(dev));
    CHECK(cudaFreeHost(out));
    CHECK(cudaFreeHost(in));
    return pass();
}

int main(int argc, char** argv) {
    if (argc > 1 && std::strcmp(argv[1], "pinned") == 0) return pinned_pointer_in_kernel();
    const int n = 1 << 16;
    const size_t bytes = n * sizeof(unsigned);
    unsigned *in = nullptr, *out = nullptr;
    CHECK(cudaHostAlloc(&in, bytes, cudaHostAllocMapped));
    CHECK(cudaHostAlloc(&out, bytes, cudaHostAllocMapped));
    unsigned *d_in = nullptr, *d_out = nullptr;
    cudaError_t e = cudaHostGetDevicePointer(&d_in, in, 0);
    if (e == cudaErrorNotSupported) {
        std::printf("mapped host memory not supported here: %s\n", cudaGetErrorName(e));
        return 3;
    }
    CHECK(e);
    CHECK(cudaHostGetDevicePointer(&d_out, out, 0));
    for (int i = 0; i < n; ++i) in[i] = static_cast<unsigned>(i % 1000);
    std::memset(out, 0xff, bytes);

    // Zero copy: the kernel reads and writes host pages.
    for (int round = 0; round < 3; ++round) {
        mm_square_plus<<<(n + 255) / 256, 256>>>(d_in, d_out, n, static_cast<unsigned>(round));
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        for (int i = 0; i < n; ++i) {
            unsigned want = in[i] * in[i] + static_cast<unsigned>(round);
            if (out[i] != want) fail("zero-copy round %d: out[%d] = %u, want %u", round, i, out[i], want);
        }
        for (int i = 0; i < n; ++i) in[i] += 1;  // the next round must see these host writes
    }
    unsigned long long sum = 0;
    for (int i = 0; i < n; ++i) sum += out[i];
    std::printf("zero-copy kernel over mapped host memory: 3 rounds ok, checksum %llu\n", sum);

    // Mapped memory as the source and destination of copies, sync and async.
    unsigned* dev = nullptr;
    CHECK(cudaMalloc(&dev, bytes));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMemcpy(dev, in, bytes, cudaMemcpyHostToDevice));
    mm_square_plus<<<(n + 255) / 256, 256>>>(dev, dev, n, 7);
    std::memset(out, 0, bytes);
    CHECK(cudaMemcpy(out, dev, bytes, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i)
        if (out[i] != in[i] * in[i] + 7) fail("sync copies: out[%d] = %u", i, out[i]);
    CHECK(cudaMemcpyAsync(dev, out, bytes, cudaMemcpyHostToDevice, s));
    mm_square_plus<<<(n + 255) / 256, 256, 0, s>>>(dev, dev, n, 1);
    CHECK(cudaMemcpyAsync(in, dev, bytes, cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; ++i)
        if (in[i] != out[i] * out[i] + 1) fail("async copies: in[%d] = %u", i, in[i]);
    std::printf("copies from and into mapped host memory: ok\n");
    // Its device pointers as a copy's device side (XLA's autotuner reads results back this way).
    std::vector<unsigned> back(n);
    CHECK(cudaMemcpy(back.data(), d_in, bytes, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(dev, d_out, bytes, cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpy(d_out, back.data(), bytes, cudaMemcpyHostToDevice));
    for (int i = 0; i < n; ++i)
        if (back[i] != in[i] || out[i] != in[i]) fail("copies by device pointer: word %d", i);
    std::printf("copies with mapped memory's device pointers: ok\n");

    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(dev));
    CHECK(cudaFreeHost(in));
    CHECK(cudaFreeHost(out));
    std::printf("PASS mapped_memory\n");
    return 0;
}
