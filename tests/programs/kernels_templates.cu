// kernels_templates: several kernels in one image, templated kernels (a block reduction over float, int and
// double; an axpy over three types; a fill with a non-type template parameter; a tiled matrix product with
// shared memory and 2D blocks) and a kernel whose parameters have mixed sizes and alignments.
#include <cuda_runtime.h>

#include <cmath>
#include <vector>

#include "common.cuh"

namespace kt {

// Grid-stride accumulation per thread, then a tree in shared memory: deterministic for a given launch shape.
// blockDim.x must be a power of two and at most 256.
template <class T>
__global__ void reduce_sum(const T* in, T* out, unsigned n) {
    __shared__ T buf[256];
    unsigned t = threadIdx.x;
    T acc = T(0);
    for (unsigned i = blockIdx.x * blockDim.x + t; i < n; i += gridDim.x * blockDim.x) acc += in[i];
    buf[t] = acc;
    __syncthreads();
    for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (t < s) buf[t] += buf[t + s];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = buf[0];
}

template <class T>
__global__ void axpy(T* y, const T* x, T alpha, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = alpha * x[i] + y[i];
}

template <class T, int N>
__global__ void fill_mod(T* out, unsigned n) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = T(i % N);
}

// C[M x N] = A[M x K] * B[K x N], row-major, TILE x TILE blocks.
template <int TILE>
__global__ void matmul_tiled(const float* A, const float* B, float* C, int M, int N, int K) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int row = blockIdx.y * TILE + threadIdx.y;
    int col = blockIdx.x * TILE + threadIdx.x;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        int ka = k0 + threadIdx.x, kb = k0 + threadIdx.y;
        As[threadIdx.y][threadIdx.x] = (row < M && ka < K) ? A[row * K + ka] : 0.0f;
        Bs[threadIdx.y][threadIdx.x] = (kb < K && col < N) ? B[kb * N + col] : 0.0f;
        __syncthreads();
        for (int kk = 0; kk < TILE; ++kk) acc += As[threadIdx.y][kk] * Bs[kk][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N) C[row * N + col] = acc;
}

template __global__ void reduce_sum<float>(const float*, float*, unsigned);
template __global__ void reduce_sum<int>(const int*, int*, unsigned);
template __global__ void reduce_sum<double>(const double*, double*, unsigned);
template __global__ void axpy<float>(float*, const float*, float, unsigned);
template __global__ void axpy<double>(double*, const double*, double, unsigned);
template __global__ void axpy<int>(int*, const int*, int, unsigned);
template __global__ void fill_mod<int, 7>(int*, unsigned);
template __global__ void fill_mod<double, 3>(double*, unsigned);
template __global__ void matmul_tiled<16>(const float*, const float*, float*, int, int, int);

}  // namespace kt

// Parameters of sizes 1, 8, 2, 8, 4, 8, 1: offsets 0, 8, 16, 24, 32, 40, 48.
extern "C" __global__ void kt_mixed_params(char c, double d, short s, int* out, float f, long long ll,
                                           unsigned char uc) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        out[0] = c;
        out[1] = static_cast<int>(d * 1000.0);
        out[2] = s;
        out[3] = static_cast<int>(f * 100.0f);
        out[4] = static_cast<int>(ll >> 32);
        out[5] = static_cast<int>(ll & 0xffffffff);
        out[6] = uc;
    }
}

template <class T>
static T device_sum(const std::vector<T>& h, const char* what) {
    const unsigned n = static_cast<unsigned>(h.size());
    const int grid = 64, block = 256;
    T *din, *dpart, *dres;
    CHECK(cudaMalloc(&din, n * sizeof(T)));
    CHECK(cudaMalloc(&dpart, grid * sizeof(T)));
    CHECK(cudaMalloc(&dres, sizeof(T)));
    CHECK(cudaMemcpy(din, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    kt::reduce_sum<T><<<grid, block>>>(din, dpart, n);
    CHECK_LAUNCH();
    kt::reduce_sum<T><<<1, grid>>>(dpart, dres, grid);
    CHECK_LAUNCH();
    T r;
    CHECK(cudaMemcpy(&r, dres, sizeof(T), cudaMemcpyDeviceToHost));
    CHECK(cudaFree(din));
    CHECK(cudaFree(dpart));
    CHECK(cudaFree(dres));
    (void)what;
    return r;
}

template <class T>
static void check_axpy(const char* what, T alpha, double tol) {
    const unsigned n = 100003;
    std::vector<T> x(n), y(n), out(n);
    rng r(42);
    for (unsigned i = 0; i < n; ++i) {
        x[i] = static_cast<T>(static_cast<int>(r.u32() % 2001) - 1000) / T(8);
        y[i] = static_cast<T>(static_cast<int>(r.u32() % 2001) - 1000) / T(4);
    }
    T *dx, *dy;
    CHECK(cudaMalloc(&dx, n * sizeof(T)));
    CHECK(cudaMalloc(&dy, n * sizeof(T)));
    CHECK(cudaMemcpy(dx, x.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dy, y.data(), n * sizeof(T), cudaMemcpyHostToDevice));
    kt::axpy<T><<<(n + 127) / 128, 128>>>(dy, dx, alpha, n);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(out.data(), dy, n * sizeof(T), cudaMemcpyDeviceToHost));
    double digest = 0;
    for (unsigned i = 0; i < n; ++i) {
        double want = static_cast<double>(alpha) * static_cast<double>(x[i]) + static_cast<double>(y[i]);
        if (std::fabs(static_cast<double>(out[i]) - want) > tol * (1.0 + std::fabs(want)))
            fail("axpy<%s>: y[%u] = %.17g, expected %.17g", what, i, static_cast<double>(out[i]), want);
        digest += static_cast<double>(out[i]);
    }
    printf("axpy<%s>: %u elements ok, sum %.6f\n", what, n, digest);
    CHECK(cudaFree(dx));
    CHECK(cudaFree(dy));
}

int main() {
    // --- reductions
    const unsigned n = 1000017;
    rng r(7);
    std::vector<float> hf(n);
    std::vector<int> hi(n);
    std::vector<double> hd(n);
    double ref_f = 0, ref_d = 0;
    long long ref_i = 0;
    for (unsigned i = 0; i < n; ++i) {
        hf[i] = r.unit();
        hi[i] = static_cast<int>(r.u32() % 2001) - 1000;
        hd[i] = static_cast<double>(r.u32()) / 4294967296.0;
        ref_f += hf[i];
        ref_i += hi[i];
        ref_d += hd[i];
    }
    float sf = device_sum(hf, "float");
    int si = device_sum(hi, "int");
    double sd = device_sum(hd, "double");
    EXPECT(std::fabs(sf - ref_f) <= 1e-5 * std::fabs(ref_f), "reduce_sum<float> = %.9g, expected %.9g", sf,
           ref_f);
    EXPECT(si == ref_i, "reduce_sum<int> = %d, expected %lld", si, ref_i);
    EXPECT(std::fabs(sd - ref_d) <= 1e-12 * std::fabs(ref_d), "reduce_sum<double> = %.17g, expected %.17g",
           sd, ref_d);
    printf("reduce_sum<float>: %.7g\n", sf);
    printf("reduce_sum<int>: %d\n", si);
    printf("reduce_sum<double>: %.15g\n", sd);

    // --- axpy over three types
    check_axpy<float>("float", 1.5f, 1e-6);
    check_axpy<double>("double", -2.25, 1e-14);
    check_axpy<int>("int", 3, 0);

    // --- fill with non-type template parameters
    {
        const unsigned m = 50001;
        int* di;
        double* dd;
        CHECK(cudaMalloc(&di, m * sizeof(int)));
        CHECK(cudaMalloc(&dd, m * sizeof(double)));
        kt::fill_mod<int, 7><<<40, 128>>>(di, m);
        CHECK_LAUNCH();
        kt::fill_mod<double, 3><<<13, 96>>>(dd, m);
        CHECK_LAUNCH();
        std::vector<int> oi(m);
        std::vector<double> od(m);
        CHECK(cudaMemcpy(oi.data(), di, m * sizeof(int), cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(od.data(), dd, m * sizeof(double), cudaMemcpyDeviceToHost));
        for (unsigned i = 0; i < m; ++i) {
            EXPECT(oi[i] == static_cast<int>(i % 7), "fill_mod<int,7>[%u] = %d", i, oi[i]);
            EXPECT(od[i] == static_cast<double>(i % 3), "fill_mod<double,3>[%u] = %g", i, od[i]);
        }
        printf("fill_mod<int,7> and fill_mod<double,3>: %u elements ok\n", m);
        CHECK(cudaFree(di));
        CHECK(cudaFree(dd));
    }

    // --- tiled matrix product, 2D grid and blocks, sizes not multiples of the tile
    {
        const int M = 130, N = 77, K = 93;
        std::vector<float> A(M * K), B(K * N), C(M * N);
        rng g(99);
        for (auto& v : A) v = static_cast<float>(static_cast<int>(g.u32() % 17) - 8) * 0.125f;
        for (auto& v : B) v = static_cast<float>(static_cast<int>(g.u32() % 13) - 6) * 0.25f;
        float *dA, *dB, *dC;
        CHECK(cudaMalloc(&dA, A.size() * sizeof(float)));
        CHECK(cudaMalloc(&dB, B.size() * sizeof(float)));
        CHECK(cudaMalloc(&dC, C.size() * sizeof(float)));
        CHECK(cudaMemcpy(dA, A.data(), A.size() * sizeof(float), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(dB, B.data(), B.size() * sizeof(float), cudaMemcpyHostToDevice));
        dim3 block(16, 16), grid((N + 15) / 16, (M + 15) / 16);
        kt::matmul_tiled<16><<<grid, block>>>(dA, dB, dC, M, N, K);
        CHECK_LAUNCH();
        CHECK(cudaMemcpy(C.data(), dC, C.size() * sizeof(float), cudaMemcpyDeviceToHost));
        double trace = 0;
        for (int i = 0; i < M; ++i)
            for (int j = 0; j < N; ++j) {
                double want = 0;
                for (int k = 0; k < K; ++k) want += static_cast<double>(A[i * K + k]) * B[k * N + j];
                // inputs are multiples of 1/32 with small numerators: every partial sum is exact in float
                EXPECT(C[i * N + j] == static_cast<float>(want), "C[%d][%d] = %.9g, expected %.9g", i, j,
                       C[i * N + j], want);
                if (i == j) trace += C[i * N + j];
            }
        printf("matmul_tiled<16> %dx%d * %dx%d: ok, trace %.4f\n", M, K, K, N, trace);
        CHECK(cudaFree(dA));
        CHECK(cudaFree(dB));
        CHECK(cudaFree(dC));
    }

    // --- mixed parameter sizes and alignments
    {
        int* dout;
        CHECK(cudaMalloc(&dout, 8 * sizeof(int)));
        CHECK(cudaMemset(dout, 0, 8 * sizeof(int)));
        kt_mixed_params<<<1, 32>>>('Z', 3.25, static_cast<short>(-1234), dout, 7.5f, 0x123456789abcdefll,
                                   static_cast<unsigned char>(200));
        CHECK_LAUNCH();
        int out[8];
        CHECK(cudaMemcpy(out, dout, sizeof out, cudaMemcpyDeviceToHost));
        const int want[7] = {'Z', 3250, -1234, 750, 0x1234567, static_cast<int>(0x89abcdef), 200};
        for (int i = 0; i < 7; ++i)
            EXPECT(out[i] == want[i], "kt_mixed_params out[%d] = %d, expected %d", i, out[i], want[i]);
        printf("kt_mixed_params: %d %d %d %d %#x %#x %d\n", out[0], out[1], out[2], out[3], out[4], out[5],
               out[6]);
        CHECK(cudaFree(dout));
    }
    return pass();
}
