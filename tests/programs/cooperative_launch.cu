// cooperative_launch: a two-phase kernel joined by a grid-wide barrier
// (cooperative_groups::this_grid().sync()), launched with cudaLaunchCooperativeKernel
// (cuLaunchCooperativeKernel) and with cudaLaunchKernelEx and the cooperative attribute (cuLaunchKernelEx),
// as many blocks as fit on the device at once. Phase 1: each block sums its share of the input into
// partial[block]; phase 2, after the grid barrier: every element becomes in[i] + the total of all partials
// (which only a grid-wide barrier makes correct). A grid larger than fits is refused with
// cudaErrorCooperativeLaunchTooLarge. cuProfilerStart/cuProfilerStop (cudaProfilerStart/Stop) bracket the
// work, as profiled programs do. Everything is compared with the CPU.
#include <cooperative_groups.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <vector>

#include "common.cuh"

namespace cg = cooperative_groups;

constexpr int threads = 128;

extern "C" __global__ void coop_add_total(const int* in, int* partial, int* out, int n) {
    __shared__ int block_sum[threads];
    cg::grid_group grid = cg::this_grid();
    int s = 0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) s += in[i];
    block_sum[threadIdx.x] = s;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) block_sum[threadIdx.x] += block_sum[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = block_sum[0];
    grid.sync();
    int total = 0;
    for (unsigned b = 0; b < gridDim.x; ++b) total += partial[b];
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = in[i] + total;
}

namespace {

void check(const std::vector<int>& in, const std::vector<int>& out, const char* what) {
    long long total = 0;
    for (int v : in) total += v;
    for (size_t i = 0; i < in.size(); ++i)
        if (out[i] != in[i] + static_cast<int>(total))
            fail("%s: out[%zu] = %d, want %lld", what, i, out[i], in[i] + total);
    std::printf("%s: %zu elements ok (total %lld)\n", what, in.size(), total);
}

}  // namespace

int main() {
    int dev = 0;
    CHECK(cudaSetDevice(dev));
    int cooperative = 0, sms = 0;
    CHECK(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    if (!cooperative) fail("the device does not support cooperative launches");
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, coop_add_total, threads, 0));
    if (per_sm < 1) fail("occupancy: %d blocks per SM", per_sm);
    const int max_blocks = per_sm * sms;
    const int blocks = sms;  // fits: one block per SM
    std::printf("info: %d SMs, %d blocks per SM fit, %d blocks launched\n", sms, per_sm, blocks);

    const int n = 1 << 20;
    std::vector<int> in(n);
    for (int i = 0; i < n; ++i) in[i] = (i * 37) % 101 - 50;
    int *d_in = nullptr, *d_out = nullptr, *d_partial = nullptr;
    CHECK(cudaMalloc(&d_in, n * sizeof(int)));
    CHECK(cudaMalloc(&d_out, n * sizeof(int)));
    CHECK(cudaMalloc(&d_partial, (max_blocks + 1) * sizeof(int)));
    CHECK(cudaMemcpy(d_in, in.data(), n * sizeof(int), cudaMemcpyHostToDevice));

    CHECK(cudaProfilerStart());
    std::vector<int> out(n);
    {
        int nn = n;
        void* args[] = {&d_in, &d_partial, &d_out, &nn};
        CHECK(cudaMemset(d_out, 0, n * sizeof(int)));
        CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(coop_add_total), dim3(blocks),
                                          dim3(threads), args, 0, nullptr));
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaMemcpy(out.data(), d_out, n * sizeof(int), cudaMemcpyDeviceToHost));
        check(in, out, "cudaLaunchCooperativeKernel");
    }
    {
        cudaStream_t s;
        CHECK(cudaStreamCreate(&s));
        cudaLaunchConfig_t config = {};
        config.gridDim = dim3(blocks / 2 > 0 ? blocks / 2 : 1);
        config.blockDim = dim3(threads);
        config.stream = s;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeCooperative;
        attr[0].val.cooperative = 1;
        config.attrs = attr;
        config.numAttrs = 1;
        CHECK(cudaMemset(d_out, 0, n * sizeof(int)));
        CHECK(
            cudaLaunchKernelEx(&config, coop_add_total, static_cast<const int*>(d_in), d_partial, d_out, n));
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaMemcpy(out.data(), d_out, n * sizeof(int), cudaMemcpyDeviceToHost));
        check(in, out, "cudaLaunchKernelEx with the cooperative attribute");
        CHECK(cudaStreamDestroy(s));
    }
    CHECK(cudaProfilerStop());

    // A grid that cannot be resident at once is refused; the context goes on.
    {
        int nn = n;
        void* args[] = {&d_in, &d_partial, &d_out, &nn};
        cudaError_t e = cudaLaunchCooperativeKernel(reinterpret_cast<void*>(coop_add_total),
                                                    dim3(max_blocks + 1), dim3(threads), args, 0, nullptr);
        if (e != cudaErrorCooperativeLaunchTooLarge)
            fail("a grid of %d blocks (%d fit): %s, want cudaErrorCooperativeLaunchTooLarge", max_blocks + 1,
                 max_blocks, cudaGetErrorName(e));
        cudaGetLastError();
        std::printf(
            "a cooperative grid too large to be resident: refused (cudaErrorCooperativeLaunchTooLarge)\n");
        CHECK(cudaDeviceSynchronize());
    }

    CHECK(cudaFree(d_in));
    CHECK(cudaFree(d_out));
    CHECK(cudaFree(d_partial));
    return pass();
}
