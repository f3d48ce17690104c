// late_thread_runtime: kernels first launched from threads started after the program's first launch, as
// PyTorch's autograd thread does (through vcuda each such thread is a new lane). With lazy loading the
// runtime looks each kernel up at its first launch, on the thread that launches it.
#include <cuda_runtime.h>

#include <thread>
#include <vector>

#include "common.cuh"

extern "C" __global__ void lt_fill(float* out, float v, double w, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = v + static_cast<float>(w) * static_cast<float>(i % 7);
}

extern "C" __global__ void lt_axpy(const float* x, float* y, float a, long long n, char tag) {
    long long i = blockIdx.x * static_cast<long long>(blockDim.x) + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i] + static_cast<float>(tag);
}

int main() {
    const int n = 65537;
    float *x, *y;
    CHECK(cudaMalloc(&x, n * sizeof(float)));
    CHECK(cudaMalloc(&y, n * sizeof(float)));
    lt_fill<<<(n + 255) / 256, 256>>>(x, 1.5f, 0.25, n);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());

    // A new thread: its first CUDA call is the first launch of lt_axpy (and of nothing else before it).
    std::thread([&] {
        lt_fill<<<(n + 127) / 128, 128>>>(y, -1.0f, 2.0, n);
        CHECK_LAUNCH();
        lt_axpy<<<(n + 255) / 256, 256>>>(x, y, 3.0f, n, 2);
        CHECK_LAUNCH();
        CHECK(cudaDeviceSynchronize());
    }).join();
    // Another: launches on a stream it makes.
    std::thread([&] {
        cudaStream_t s;
        CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        lt_axpy<<<(n + 511) / 512, 512, 0, s>>>(x, y, -0.5f, n, 1);
        CHECK_LAUNCH();
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaStreamDestroy(s));
    }).join();

    std::vector<float> hy(n);
    CHECK(cudaMemcpy(hy.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 0; i < n; ++i) {
        float xi = 1.5f + 0.25f * static_cast<float>(i % 7);
        float yi = -1.0f + 2.0f * static_cast<float>(i % 7);
        yi = 3.0f * xi + yi + 2.0f;
        yi = -0.5f * xi + yi + 1.0f;
        if (hy[i] != yi) fail("y[%d] = %.9g, expected %.9g", i, hy[i], yi);
        sum += hy[i];
    }
    printf("n = %d, sum = %.3f\n", n, sum);
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    return pass();
}
