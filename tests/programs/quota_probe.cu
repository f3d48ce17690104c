// quota_probe (GPU suite, under `vcuda-server --memory-quota`): allocates 256 MiB blocks until an allocation
// fails, prints how many succeeded and the error, checks the session still works (a memset, a kernel, a
// copy), frees everything and checks that the space can be allocated again. Usage: quota_probe [MAX_BLOCKS]
// (default 64, i.e. stop at 16 GiB even if nothing fails)
#include <cuda_runtime.h>

#include <vector>

#include "common.cuh"

extern "C" __global__ void quota_fill(int* p, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v + i;
}

int main(int argc, char** argv) {
    const int max_blocks = argc > 1 ? atoi(argv[1]) : 64;
    const size_t block = size_t(256) << 20;
    size_t free_b = 0, total_b = 0;
    CHECK(cudaMemGetInfo(&free_b, &total_b));
    printf("total memory reported: %zu MiB\n", total_b >> 20);
    printf("info: free memory reported: %zu MiB\n", free_b >> 20);

    // The kernel's code and data are loaded (cudart loads lazily, at the first launch) before memory is
    // filled: they count against the quota as they take the GPU's memory, so a first launch into a full quota
    // fails with cudaErrorMemoryAllocation, as on a GPU whose memory is full.
    quota_fill<<<1, 1>>>(nullptr, 0, 0);
    CHECK_LAUNCH();

    std::vector<void*> blocks;
    cudaError_t last = cudaSuccess;
    for (int k = 0; k < max_blocks; ++k) {
        void* p = nullptr;
        last = cudaMalloc(&p, block);
        if (last != cudaSuccess) break;
        blocks.push_back(p);
    }
    printf("256 MiB allocations that succeeded: %zu\n", blocks.size());
    printf("the next one returned: %s\n", cudaGetErrorName(last));
    EXPECT(last != cudaSuccess, "no allocation failed within %d blocks: is a quota set?", max_blocks);
    EXPECT(last == cudaErrorMemoryAllocation,
           "the failing allocation returned %s, expected cudaErrorMemoryAllocation", cudaGetErrorName(last));
    EXPECT(!blocks.empty(), "not even one 256 MiB block could be allocated");
    EXPECT(cudaGetLastError() == cudaErrorMemoryAllocation, "the error was not recorded");
    EXPECT(cudaGetLastError() == cudaSuccess, "the allocation error is sticky");

    // The session still works, in the memory it got.
    const int n = 1 << 20;
    int* d = static_cast<int*>(blocks.back());
    CHECK(cudaMemset(d, 0, n * sizeof(int)));
    quota_fill<<<n / 256, 256>>>(d, n, 77);
    CHECK_LAUNCH();
    std::vector<int> h(n);
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) EXPECT(h[i] == 77 + i, "after the failed allocation: [%d] = %d", i, h[i]);
    printf("memset, kernel and copy after the failed allocation: ok\n");

    for (void* p : blocks) CHECK(cudaFree(p));
    void* again = nullptr;
    CHECK(cudaMalloc(&again, block));
    printf("after freeing: a 256 MiB allocation succeeds again\n");
    CHECK(cudaFree(again));
    return pass();
}
