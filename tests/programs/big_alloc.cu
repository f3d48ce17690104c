// big_alloc (GPU only: needs a real GPU with more than 16 GiB): one 16 GiB allocation, zeroed with
// cudaMemset, marked by a kernel at a stride across its whole length, summed on the device, and sampled back
// at the start, the middle and the very end.
#include <cuda_runtime.h>

#include <vector>

#include "common.cuh"

extern "C" __global__ void ba_mark(unsigned long long* p, unsigned long long words,
                                   unsigned long long stride) {
    for (unsigned long long k = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; k * stride < words;
         k += (unsigned long long)gridDim.x * blockDim.x)
        p[k * stride] = k + 1;
}

extern "C" __global__ void ba_sum(const unsigned long long* p, unsigned long long words,
                                  unsigned long long* out) {
    unsigned long long s = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < words;
         i += (unsigned long long)gridDim.x * blockDim.x)
        s += p[i];
    atomicAdd(out, s);
}

int main() {
    const size_t bytes = size_t(16) << 30;
    const unsigned long long words = bytes / sizeof(unsigned long long);
    const unsigned long long stride = 4099;  // odd: marks land in every page of the allocation

    size_t free_b = 0, total_b = 0;
    CHECK(cudaMemGetInfo(&free_b, &total_b));
    printf("info: before: free %zu MiB of %zu MiB\n", free_b >> 20, total_b >> 20);

    unsigned long long* p = nullptr;
    CHECK(cudaMalloc(&p, bytes));
    printf("allocated %zu bytes (16 GiB) in one cudaMalloc\n", bytes);
    CHECK(cudaMemGetInfo(&free_b, &total_b));
    printf("info: after: free %zu MiB\n", free_b >> 20);

    CHECK(cudaMemset(p, 0, bytes));
    ba_mark<<<1024, 256>>>(p, words, stride);
    CHECK_LAUNCH();
    unsigned long long* d_sum;
    CHECK(cudaMalloc(&d_sum, sizeof(unsigned long long)));
    CHECK(cudaMemset(d_sum, 0, sizeof(unsigned long long)));
    ba_sum<<<2048, 256>>>(p, words, d_sum);
    CHECK_LAUNCH();
    unsigned long long sum = 0;
    CHECK(cudaMemcpy(&sum, d_sum, sizeof sum, cudaMemcpyDeviceToHost));
    const unsigned long long marks = (words + stride - 1) / stride;
    const unsigned long long want = marks * (marks + 1) / 2;
    printf("marks: %llu, device sum %llu\n", marks, sum);
    EXPECT(sum == want, "sum %llu, expected %llu", sum, want);

    // Samples: the first, the middle and the last 64 KiB.
    const size_t sample = 8192;  // words
    const unsigned long long starts[3] = {0, words / 2 - sample / 2, words - sample};
    std::vector<unsigned long long> h(sample);
    for (unsigned long long s0 : starts) {
        CHECK(cudaMemcpy(h.data(), p + s0, sample * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < sample; ++i) {
            unsigned long long idx = s0 + i;
            unsigned long long expect = idx % stride == 0 ? idx / stride + 1 : 0;
            if (h[i] != expect) fail("word %llu = %llu, expected %llu", idx, h[i], expect);
        }
        printf("sample at word %llu: ok\n", s0);
    }

    CHECK(cudaFree(d_sum));
    CHECK(cudaFree(p));
    return pass();
}
