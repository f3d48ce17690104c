// device_printf: what kernels print reaches the program's own stdout, in order with its own lines, flushed
// where CUDA flushes it (at a synchronize). Through vcuda the server's driver writes it; the lane brings it
// back.
#include <cuda_runtime.h>

#include "common.cuh"

extern "C" __global__ void dp_say(int k, float v) {
    printf("kernel %d thread %d says %.2f\n", k, threadIdx.x, v);
}

extern "C" __global__ void dp_count_lines(int n) {
    for (int i = 0; i < n; ++i) printf("line %d of %d\n", i, n);
}

int main() {
    printf("host: before\n");
    dp_say<<<1, 1>>>(1, 1.5f);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    printf("host: after the first kernel\n");
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    dp_say<<<1, 1, 0, s>>>(2, 2.5f);
    dp_say<<<1, 1, 0, s>>>(3, 3.5f);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(s));
    printf("host: after the stream\n");
    dp_count_lines<<<1, 1>>>(200);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    printf("host: after 200 lines\n");
    CHECK(cudaStreamDestroy(s));
    return pass();
}
