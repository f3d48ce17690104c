// device_printf: what kernels print reaches the program's own stdout, in order with its own lines, flushed
// where CUDA flushes it (at a synchronize). Through vcuda the server's driver writes it; the lane brings it
// back. argv[1]: ms to stay idle between the last kernel and its synchronize (default 0), so that a server
// that suspends or moves idle sessions flushes that kernel's lines itself; they must still arrive.
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdlib>

#include "common.cuh"

extern "C" __global__ void dp_say(int k, float v) {
    printf("kernel %d thread %d says %.2f\n", k, threadIdx.x, v);
}

extern "C" __global__ void dp_count_lines(int n) {
    for (int i = 0; i < n; ++i) printf("line %d of %d\n", i, n);
}

int main(int argc, char** argv) {
    const int idle_ms = argc > 1 ? atoi(argv[1]) : 0;
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
    if (idle_ms > 0) usleep(static_cast<useconds_t>(idle_ms) * 1000);
    CHECK(cudaDeviceSynchronize());
    printf("host: after 200 lines\n");
    CHECK(cudaStreamDestroy(s));
    return pass();
}
