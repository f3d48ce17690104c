// device_assert: a kernel whose assert fails, as NVIDIA's simpleAssert sample and framework tests do. On a
// GPU the launch's error is CUDA_ERROR_ASSERT (710) and the process's driver state is poisoned: a
// vcuda-server in thread mode then fails every later context creation for every tenant; with --isolation
// process only this session's worker is lost. On the software test driver the kernel ends the server process
// that runs it (abort), which is what a driver crash does. Passes when the failure is reported to the
// program. Usage: device_assert [N]   (N: the assert's bound, default 0: every thread fails it; N >= 32: none
// does)
#include <cuda_runtime.h>

#include <cassert>
#include <cstdlib>

#include "common.cuh"

extern "C" __global__ void device_assert_kernel(int bound) { assert(static_cast<int>(threadIdx.x) < bound); }

int main(int argc, char** argv) {
    int bound = argc > 1 ? std::atoi(argv[1]) : 0;
    int* warm = nullptr;
    CHECK(cudaMalloc(&warm, 4));  // the session and its context exist before the kernel
    device_assert_kernel<<<1, 32>>>(bound);
    cudaError_t launch = cudaGetLastError();
    cudaError_t sync = cudaDeviceSynchronize();
    printf("launch: %s, synchronize: %s (%d)\n", cudaGetErrorName(launch), cudaGetErrorName(sync),
           static_cast<int>(sync));
    if (bound >= 32) {
        EXPECT(launch == cudaSuccess && sync == cudaSuccess, "a kernel whose assert holds failed");
        CHECK(cudaFree(warm));
        printf("PASS device_assert: no assert failed\n");
        return 0;
    }
    EXPECT(launch != cudaSuccess || sync != cudaSuccess, "the failed assert was not reported");
    printf("PASS device_assert: the failed assert was reported (%s)\n",
           cudaGetErrorName(sync != cudaSuccess ? sync : launch));
    return 0;
}
