// Uses every visible device: a different vector on each, results checked on the host. Through vcuda with a
// manager, the devices may be GPUs on different servers (ordinals 0..n-1 all the same to the program).
#include <cstdio>
#include <vector>

#include "common.cuh"

extern "C" __global__ void td_scale_add(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

int main() {
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    std::printf("devices: %d\n", count);
    const int n = 100000;
    std::vector<float*> xs(count), ys(count);
    std::vector<float> hx(n), hy(n);
    for (int i = 0; i < n; ++i) {
        hx[i] = float(i % 1000);
        hy[i] = 1.0f;
    }
    // Start work on every device before collecting any result.
    for (int d = 0; d < count; ++d) {
        CHECK(cudaSetDevice(d));
        CHECK(cudaMalloc(&xs[d], n * sizeof(float)));
        CHECK(cudaMalloc(&ys[d], n * sizeof(float)));
        CHECK(cudaMemcpy(xs[d], hx.data(), n * sizeof(float), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(ys[d], hy.data(), n * sizeof(float), cudaMemcpyHostToDevice));
        td_scale_add<<<(n + 255) / 256, 256>>>(xs[d], ys[d], float(d + 2), n);
        CHECK(cudaGetLastError());
    }
    for (int d = 0; d < count; ++d) {
        CHECK(cudaSetDevice(d));
        std::vector<float> out(n);
        CHECK(cudaMemcpy(out.data(), ys[d], n * sizeof(float), cudaMemcpyDeviceToHost));
        for (int i = 0; i < n; ++i) {
            float want = float(d + 2) * hx[i] + 1.0f;
            if (out[i] != want) {
                std::printf("FAIL two_devices: device %d element %d is %f, expected %f\n", d, i, out[i],
                            want);
                return 1;
            }
        }
        std::printf("device %d: ok\n", d);
        CHECK(cudaFree(xs[d]));
        CHECK(cudaFree(ys[d]));
    }
    std::printf("PASS two_devices\n");
    return 0;
}
