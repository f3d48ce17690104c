// vector_add: the smallest whole program — allocate, copy in, launch, copy out, check.
// Also built with `-cudart shared` as vector_add_shared, and run with CUDA_MODULE_LOADING=EAGER by the
// scripts.
#include <cuda_runtime.h>

#include <vector>

#include "common.cuh"

extern "C" __global__ void vector_add(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

int main() {
    const int n = (1 << 20) + 3;  // not a multiple of the block size: the bound check matters
    const size_t bytes = n * sizeof(float);
    std::vector<float> a(n), b(n), c(n, -1.0f);
    for (int i = 0; i < n; ++i) {
        a[i] = static_cast<float>(i % 1000) * 0.5f;
        b[i] = static_cast<float>(i % 977) * 0.25f;
    }

    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    printf("devices: %s\n", count > 0 ? "at least one" : "none");
    EXPECT(count > 0, "no device");

    float *da, *db, *dc;
    CHECK(cudaMalloc(&da, bytes));
    CHECK(cudaMalloc(&db, bytes));
    CHECK(cudaMalloc(&dc, bytes));
    CHECK(cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(db, b.data(), bytes, cudaMemcpyHostToDevice));

    const int block = 256;
    const int grid = (n + block - 1) / block;
    vector_add<<<grid, block>>>(da, db, dc, n);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(c.data(), dc, bytes, cudaMemcpyDeviceToHost));

    double sum = 0;
    for (int i = 0; i < n; ++i) {
        float want = a[i] + b[i];
        if (c[i] != want) fail("c[%d] = %.9g, expected %.9g", i, c[i], want);
        sum += c[i];
    }
    printf("n = %d, grid = %d x %d\n", n, grid, block);
    printf("c[0] = %.3f, c[12345] = %.3f, c[n-1] = %.3f\n", c[0], c[12345], c[n - 1]);
    printf("sum = %.3f\n", sum);

    // A second launch into the same buffers: the module is loaded once, the kernel found again.
    vector_add<<<grid, block>>>(dc, dc, dc, n);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(c.data(), dc, bytes, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) {
        float want = 2.0f * (a[i] + b[i]);
        if (c[i] != want) fail("second launch: c[%d] = %.9g, expected %.9g", i, c[i], want);
    }
    printf("second launch ok\n");

    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dc));
    return pass();
}
