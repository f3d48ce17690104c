// func_attributes: what the runtime reports about kernels — cudaFuncGetAttributes field by field (shared,
// constant and local sizes, registers, max threads under __launch_bounds__, versions, cluster fields) and the
// occupancy API (cudaOccupancyMaxActiveBlocksPerMultiprocessor, cudaOccupancyMaxPotentialBlockSize) — then
// launches each kernel at the suggested shape and checks its result. Then setters repeated as PyTorch repeats
// them every step: the same value again changes nothing (through vcuda: no round trip), a new value takes
// effect at once, also for launches that need more than 48 KiB of dynamic shared memory.
#include <cuda_runtime.h>

#include <vector>

#include "common.cuh"

extern "C" __global__ void fa_small(int* p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = i * 2;
}

extern "C" __global__ void __launch_bounds__(128) fa_bounded(float* p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = p[i] * 0.5f + 1.0f;
}

// Reverses each block's 256-element segment through 8 KiB of static shared memory.
extern "C" __global__ void fa_shared(const float* in, float* out, int n) {
    __shared__ float buf[2048];
    int t = threadIdx.x, base = blockIdx.x * 256;
    if (base + t < n) buf[t] = in[base + t];
    buf[1024 + t] = 0.0f;
    __syncthreads();
    int src = 255 - t;
    if (base + t < n && base + src < n) out[base + t] = buf[src] + buf[1024 + t];
}

// out[i] = i + 1, staged through dynamic shared memory.
extern "C" __global__ void fa_dynamic(float* out, int n) {
    extern __shared__ float dyn[];
    int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    dyn[t] = static_cast<float>(i);
    __syncthreads();
    if (i < n) out[i] = dyn[t] + 1.0f;
}

static void print_attrs(const char* name, const void* fn) {
    cudaFuncAttributes a;
    CHECK(cudaFuncGetAttributes(&a, fn));
    printf(
        "%s: sharedSizeBytes %zu, constSizeBytes %zu, localSizeBytes %zu, maxThreadsPerBlock %d, numRegs %d, "
        "ptxVersion %d, binaryVersion %d, cacheModeCA %d, maxDynamicSharedSizeBytes %d, "
        "preferredShmemCarveout %d, clusterDimMustBeSet %d, requiredCluster %d %d %d, "
        "clusterSchedulingPolicyPreference %d, nonPortableClusterSizeAllowed %d\n",
        name, a.sharedSizeBytes, a.constSizeBytes, a.localSizeBytes, a.maxThreadsPerBlock, a.numRegs,
        a.ptxVersion, a.binaryVersion, a.cacheModeCA, a.maxDynamicSharedSizeBytes, a.preferredShmemCarveout,
        a.clusterDimMustBeSet, a.requiredClusterWidth, a.requiredClusterHeight, a.requiredClusterDepth,
        a.clusterSchedulingPolicyPreference, a.nonPortableClusterSizeAllowed);
    EXPECT(a.maxThreadsPerBlock > 0, "%s: maxThreadsPerBlock %d", name, a.maxThreadsPerBlock);
}

// The deprecated bank-size setting (older programs still make these calls): accepted, ignored where banks
// have one width, and read back; an unknown value refused.
#pragma nv_diag_suppress 1444  // deprecated on purpose
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static void shared_mem_config() {
    CHECK(cudaDeviceSetSharedMemConfig(cudaSharedMemBankSizeEightByte));
    cudaSharedMemConfig c;
    CHECK(cudaDeviceGetSharedMemConfig(&c));
    printf("device shared memory config after asking for 8-byte banks: %d\n", int(c));
    CHECK(cudaFuncSetSharedMemConfig(fa_dynamic, cudaSharedMemBankSizeFourByte));
    cudaError_t bad = cudaDeviceSetSharedMemConfig(static_cast<cudaSharedMemConfig>(7));
    cudaGetLastError();
    CHECK(cudaDeviceGetSharedMemConfig(&c));
    printf("an unknown config: %s; config now %d\n", cudaGetErrorName(bad), int(c));
    CHECK(cudaDeviceSetSharedMemConfig(cudaSharedMemBankSizeDefault));
}
#pragma GCC diagnostic pop

int main() {
    print_attrs("fa_small", reinterpret_cast<const void*>(fa_small));
    print_attrs("fa_bounded", reinterpret_cast<const void*>(fa_bounded));
    print_attrs("fa_shared", reinterpret_cast<const void*>(fa_shared));
    // The values themselves (registers, __launch_bounds__(128) as maxThreadsPerBlock 128, 8 KiB of static
    // shared memory) are checked by comparing with a native run on a GPU: the software test driver of CI
    // knows a kernel's parameters, not its resource usage.

    int blocks = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fa_small, 256, 0));
    printf("occupancy fa_small @256: %d blocks per SM\n", blocks);
    EXPECT(blocks > 0, "occupancy 0");
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fa_shared, 256, 0));
    printf("occupancy fa_shared @256: %d blocks per SM\n", blocks);
    EXPECT(blocks > 0, "occupancy 0");
    int min_grid = 0, block = 0;
    CHECK(cudaOccupancyMaxPotentialBlockSize(&min_grid, &block, fa_small, 0, 0));
    printf("fa_small potential block size %d, min grid %d\n", block, min_grid);
    EXPECT(block > 0 && block <= 1024, "potential block size %d", block);
    int bmin = 0, bblock = 0;
    CHECK(cudaOccupancyMaxPotentialBlockSize(&bmin, &bblock, fa_bounded, 0, 0));
    printf("fa_bounded potential block size %d, min grid %d\n", bblock, bmin);
    EXPECT(bblock > 0 && bblock <= 1024, "fa_bounded potential block size %d", bblock);

    const int n = 100000;
    int* di;
    float *df, *dout;
    CHECK(cudaMalloc(&di, n * sizeof(int)));
    CHECK(cudaMalloc(&df, n * sizeof(float)));
    CHECK(cudaMalloc(&dout, n * sizeof(float)));
    fa_small<<<(n + block - 1) / block, block>>>(di, n);
    CHECK_LAUNCH();
    std::vector<float> hf(n), out(n);
    for (int i = 0; i < n; ++i) hf[i] = static_cast<float>(i % 4096);
    CHECK(cudaMemcpy(df, hf.data(), n * sizeof(float), cudaMemcpyHostToDevice));
    fa_bounded<<<(n + bblock - 1) / bblock, bblock>>>(df, n);
    CHECK_LAUNCH();
    fa_shared<<<(n + 255) / 256, 256>>>(df, dout, n);
    CHECK_LAUNCH();
    std::vector<int> hi(n);
    CHECK(cudaMemcpy(hi.data(), di, n * sizeof(int), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(out.data(), dout, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) EXPECT(hi[i] == 2 * i, "fa_small [%d] = %d", i, hi[i]);
    for (int i = 0; i < (n / 256) * 256; ++i) {
        int base = i / 256 * 256, t = i % 256;
        float want = hf[base + 255 - t] * 0.5f + 1.0f;
        EXPECT(out[i] == want, "fa_bounded + fa_shared [%d] = %g, expected %g", i, out[i], want);
    }
    printf("launches at the suggested shapes: ok\n");

    // Setters repeated each step, two targets alternating, with queries and big-shared launches between them.
    const int big = 64 << 10;
    auto dyn_launch = [&](int shared) {
        fa_dynamic<<<(n + 255) / 256, 256, shared>>>(dout, n);
        return cudaGetLastError();
    };
    CHECK(cudaFuncSetAttribute(fa_dynamic, cudaFuncAttributeMaxDynamicSharedMemorySize, big));
    unsigned long long trips0 = 0, trips1 = 0;
    bool counted = false;
    for (int step = 0; step < 51; ++step) {
        if (step == 1) counted = vcuda_round_trips(&trips0);  // step 0 is the warm-up
        CHECK(cudaFuncSetAttribute(fa_dynamic, cudaFuncAttributeMaxDynamicSharedMemorySize, big));
        CHECK(cudaFuncSetAttribute(fa_small, cudaFuncAttributePreferredSharedMemoryCarveout, 50));
        cudaFuncAttributes a;
        CHECK(cudaFuncGetAttributes(&a, fa_dynamic));
        EXPECT(a.maxDynamicSharedSizeBytes == big, "step %d: maxDynamicSharedSizeBytes %d", step,
               a.maxDynamicSharedSizeBytes);
        CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fa_dynamic, 256, big));
        EXPECT(blocks > 0, "step %d: occupancy 0 with 64 KiB of dynamic shared memory", step);
        CHECK(dyn_launch(big));
        // Switched to a smaller limit and back within the step, as PyTorch does between kernels' needs.
        CHECK(cudaFuncSetAttribute(fa_dynamic, cudaFuncAttributeMaxDynamicSharedMemorySize, 40 << 10));
        CHECK(cudaFuncGetAttributes(&a, fa_dynamic));
        EXPECT(a.maxDynamicSharedSizeBytes == (40 << 10), "step %d: switched maxDynamicSharedSizeBytes %d",
               step, a.maxDynamicSharedSizeBytes);
        CHECK(dyn_launch(40 << 10));
        CHECK(cudaFuncSetAttribute(fa_dynamic, cudaFuncAttributeMaxDynamicSharedMemorySize, big));
    }
    if (counted && vcuda_round_trips(&trips1)) {
        printf(
            "info: 50 steps (after one) of 4 setters, 3 queries and 2 big-shared launches: %llu round "
            "trips\n",
            trips1 - trips0);
        EXPECT(trips1 - trips0 <= 10,
               "repeated setters, queries and launches cost %llu round trips (at most 10 expected)",
               trips1 - trips0);
    }
    CHECK(cudaMemcpy(out.data(), dout, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) EXPECT(out[i] == i + 1.0f, "fa_dynamic [%d] = %g", i, out[i]);
    // A lower limit takes effect at once: the same launch is refused at the call; raised again, it runs.
    CHECK(cudaFuncSetAttribute(fa_dynamic, cudaFuncAttributeMaxDynamicSharedMemorySize, 1024));
    cudaFuncAttributes lowered;
    CHECK(cudaFuncGetAttributes(&lowered, fa_dynamic));
    printf("lowered maxDynamicSharedSizeBytes %d; 64 KiB launch: %s\n", lowered.maxDynamicSharedSizeBytes,
           cudaGetErrorName(dyn_launch(big)));
    CHECK(cudaFuncSetAttribute(fa_dynamic, cudaFuncAttributeMaxDynamicSharedMemorySize, big));
    CHECK(cudaMemset(dout, 0, n * sizeof(float)));
    CHECK(dyn_launch(big));
    CHECK(cudaMemcpy(out.data(), dout, n * sizeof(float), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) EXPECT(out[i] == i + 1.0f, "fa_dynamic after raising [%d] = %g", i, out[i]);
    printf("setters repeated, lowered and raised: ok\n");
    shared_mem_config();
    CHECK(cudaFree(di));
    CHECK(cudaFree(df));
    CHECK(cudaFree(dout));
    return pass();
}
