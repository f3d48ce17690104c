// cublas_gemm: cuBLAS through vcuda — a handle bound to a created stream, cublasSgemm (FP32, alpha/beta, C
// accumulated) and cublasGemmEx on FP16 inputs and output with FP32 compute (A transposed), each checked
// against a CPU reference in double. GPU only (the software driver of CI cannot run cuBLAS kernels).
// Built with -lcublas (dynamic); at run time libcublas.so.13 and libcublasLt.so.13 come from LD_LIBRARY_PATH.
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <vector>

#include "common.cuh"

#define CHECK_CUBLAS(call)                                                         \
    do {                                                                           \
        cublasStatus_t s_ = (call);                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                           \
            fail("%s returned %s (%s) at line %d", #call, cublasGetStatusName(s_), \
                 cublasGetStatusString(s_), __LINE__);                             \
    } while (0)

// Multiples of 1/128 in [-1, 1]: exact as float, half (and TF32), so the CPU reference sees the GPU's inputs.
static float quantized(rng& r) { return static_cast<float>(static_cast<int>(r.u32() % 257) - 128) / 128.0f; }

int main() {
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    EXPECT(count > 0, "no device");

    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cublasHandle_t handle;
    CHECK_CUBLAS(cublasCreate(&handle));
    CHECK_CUBLAS(cublasSetStream(handle, stream));
    cudaStream_t got_stream = nullptr;
    CHECK_CUBLAS(cublasGetStream(handle, &got_stream));
    EXPECT(got_stream == stream, "cublasGetStream returned another stream than the one set");
    int version = 0;
    CHECK_CUBLAS(cublasGetVersion(handle, &version));
    printf("info: cublas version %d\n", version);

    // ------------------------------------------------------------------ SGEMM: C = alpha * A * B + beta * C
    // Column-major: A is m x k (lda = m), B is k x n (ldb = k), C is m x n (ldc = m).
    const int m = 256, n = 192, k = 128;
    const float alpha = 1.5f, beta = -0.5f;
    rng r(0x5eed0001);
    std::vector<float> a(size_t(m) * k), b(size_t(k) * n), c0(size_t(m) * n), c(size_t(m) * n);
    for (auto& v : a) v = quantized(r);
    for (auto& v : b) v = quantized(r);
    for (auto& v : c0) v = quantized(r);

    float *da, *db, *dc;
    CHECK(cudaMalloc(&da, a.size() * sizeof(float)));
    CHECK(cudaMalloc(&db, b.size() * sizeof(float)));
    CHECK(cudaMalloc(&dc, c.size() * sizeof(float)));
    CHECK(cudaMemcpyAsync(da, a.data(), a.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
    CHECK(cudaMemcpyAsync(db, b.data(), b.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
    CHECK(cudaMemcpyAsync(dc, c0.data(), c0.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
    CHECK_CUBLAS(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, da, m, db, k, &beta, dc, m));
    CHECK(cudaMemcpyAsync(c.data(), dc, c.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));

    double sum = 0, max_err = 0;
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i) {
            double ref = 0, mag = 0;
            for (int l = 0; l < k; ++l) {
                double p = double(a[size_t(l) * m + i]) * double(b[size_t(j) * k + l]);
                ref += p;
                mag += std::fabs(p);
            }
            const double c_in = c0[size_t(j) * m + i];
            ref = alpha * ref + beta * c_in;
            mag = std::fabs(alpha) * mag + std::fabs(beta) * std::fabs(c_in);
            const double got = c[size_t(j) * m + i];
            const double err = std::fabs(got - ref);
            // The inputs are multiples of 2^-7 and the partial sums stay below 2^7: every FP32 sum is exact,
            // whatever the order; the tolerance only covers a library that rounds somewhere.
            if (!(err <= 1e-4 * mag + 1e-5))
                fail("sgemm: C(%d,%d) = %.9g, expected %.9g (error %.3g, magnitude %.3g)", i, j, got, ref,
                     err, mag);
            if (mag > 0 && err / mag > max_err) max_err = err / mag;
            sum += got;
        }
    printf("sgemm %dx%dx%d alpha=%.2f beta=%.2f: ok\n", m, n, k, alpha, beta);
    printf("sgemm checksum = %.3f, C(0,0) = %.4f, C(m-1,n-1) = %.4f\n", sum, c[0], c[c.size() - 1]);
    printf("info: sgemm max relative error %.3g\n", max_err);

    // ------------------------------------------------------------------ GemmEx FP16: C = A^T * B
    // A is stored k x m (lda = k) and used transposed, B is k x n (ldb = k), C is m x n (ldc = m), all half.
    std::vector<float> ah(size_t(k) * m), bh(size_t(k) * n);
    for (auto& v : ah) v = quantized(r);
    for (auto& v : bh) v = quantized(r);
    std::vector<__half> ah16(ah.size()), bh16(bh.size()), ch16(size_t(m) * n);
    for (size_t i = 0; i < ah.size(); ++i) ah16[i] = __float2half(ah[i]);
    for (size_t i = 0; i < bh.size(); ++i) bh16[i] = __float2half(bh[i]);
    for (size_t i = 0; i < ah.size(); ++i)
        EXPECT(__half2float(ah16[i]) == ah[i], "input %zu not exact in half", i);

    __half *dah, *dbh, *dch;
    CHECK(cudaMalloc(&dah, ah16.size() * sizeof(__half)));
    CHECK(cudaMalloc(&dbh, bh16.size() * sizeof(__half)));
    CHECK(cudaMalloc(&dch, ch16.size() * sizeof(__half)));
    CHECK(cudaMemcpyAsync(dah, ah16.data(), ah16.size() * sizeof(__half), cudaMemcpyHostToDevice, stream));
    CHECK(cudaMemcpyAsync(dbh, bh16.data(), bh16.size() * sizeof(__half), cudaMemcpyHostToDevice, stream));
    CHECK(cudaMemsetAsync(dch, 0xff, ch16.size() * sizeof(__half), stream));  // NaNs: beta = 0 must ignore C
    const float one = 1.0f, zero = 0.0f;  // CUBLAS_COMPUTE_32F: alpha and beta are floats
    CHECK_CUBLAS(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, dah, CUDA_R_16F, k, dbh,
                              CUDA_R_16F, k, &zero, dch, CUDA_R_16F, m, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
    CHECK(cudaMemcpyAsync(ch16.data(), dch, ch16.size() * sizeof(__half), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));

    double hsum = 0;
    max_err = 0;
    for (int j = 0; j < n; ++j)
        for (int i = 0; i < m; ++i) {
            double ref = 0, mag = 0;
            for (int l = 0; l < k; ++l) {
                double p = double(ah[size_t(i) * k + l]) * double(bh[size_t(j) * k + l]);
                ref += p;
                mag += std::fabs(p);
            }
            const double got = __half2float(ch16[size_t(j) * m + i]);
            const double err = std::fabs(got - ref);
            // The half result: rounding to 11 significant bits (relative 2^-11), plus FP32 accumulation.
            if (!(err <= 2e-3 * std::fabs(ref) + 1e-4 * mag + 1e-3))
                fail("gemmex fp16: C(%d,%d) = %.6g, expected %.6g (error %.3g)", i, j, got, ref, err);
            if (std::fabs(ref) > 1e-3 && err / std::fabs(ref) > max_err) max_err = err / std::fabs(ref);
            hsum += got;
        }
    printf("gemmex fp16 (A^T B, compute 32F) %dx%dx%d: ok\n", m, n, k);
    printf("gemmex checksum = %.2f, C(0,0) = %.3f, C(m-1,n-1) = %.3f\n", hsum, __half2float(ch16[0]),
           __half2float(ch16[ch16.size() - 1]));
    printf("info: gemmex max relative error %.3g\n", max_err);

    CHECK_CUBLAS(cublasDestroy(handle));
    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(da));
    CHECK(cudaFree(db));
    CHECK(cudaFree(dc));
    CHECK(cudaFree(dah));
    CHECK(cudaFree(dbh));
    CHECK(cudaFree(dch));
    return pass();
}
