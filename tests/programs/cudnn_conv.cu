// cudnn_conv: cuDNN 9's legacy convolution API through vcuda — forward, backward data and backward filter of
// a 3x3 convolution (pad 1, stride 1) on a small NCHW float tensor, with fixed deterministic algorithms and
// FP32 math (no TF32), each checked against a CPU reference in double. GPU only (the software driver of CI
// cannot run cuDNN kernels). Built with -lcudnn (dynamic); at run time libcudnn.so.9 and its sub-libraries
// (cudnn_cnn, cudnn_ops, cudnn_engines_*, ..., and libnvrtc for the runtime-compiled engines) come from
// LD_LIBRARY_PATH.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cmath>
#include <vector>

#include "common.cuh"

#define CHECK_CUDNN(call)                                                                              \
    do {                                                                                               \
        cudnnStatus_t s_ = (call);                                                                     \
        if (s_ != CUDNN_STATUS_SUCCESS)                                                                \
            fail("%s returned %d (%s) at line %d", #call, int(s_), cudnnGetErrorString(s_), __LINE__); \
    } while (0)

// An algorithm query: NOT_SUPPORTED gets its own message, naming the algorithm.
#define CHECK_ALGO(call, what)                                                                         \
    do {                                                                                               \
        cudnnStatus_t s_ = (call);                                                                     \
        if (s_ == CUDNN_STATUS_NOT_SUPPORTED) fail("%s is not supported for this convolution", what);  \
        if (s_ != CUDNN_STATUS_SUCCESS)                                                                \
            fail("%s returned %d (%s) at line %d", #call, int(s_), cudnnGetErrorString(s_), __LINE__); \
    } while (0)

static const int N = 2, C = 3, H = 16, W = 16, K = 4, R = 3, S = 3, PAD = 1, STRIDE = 1, DIL = 1;
static const int P = (H + 2 * PAD - DIL * (R - 1) - 1) / STRIDE + 1;
static const int Q = (W + 2 * PAD - DIL * (S - 1) - 1) / STRIDE + 1;

static size_t xi(int n, int c, int h, int w) { return ((size_t(n) * C + c) * H + h) * W + w; }
static size_t yi(int n, int k, int p, int q) { return ((size_t(n) * K + k) * P + p) * Q + q; }
static size_t wi(int k, int c, int r, int s) { return ((size_t(k) * C + c) * R + r) * S + s; }

// Multiples of 1/64 in [-1, 1]: exact as floats.
static float quantized(rng& g) { return static_cast<float>(static_cast<int>(g.u32() % 129) - 64) / 64.0f; }

// Compares got against ref; mag holds the sum of |terms| of each element, the scale of its rounding error.
static double check(const char* what, const std::vector<float>& got, const std::vector<double>& ref,
                    const std::vector<double>& mag) {
    double sum = 0, max_err = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double err = std::fabs(double(got[i]) - ref[i]);
        if (!(err <= 1e-5 * mag[i] + 1e-6))
            fail("%s: element %zu = %.9g, expected %.9g (error %.3g, magnitude %.3g)", what, i, got[i],
                 ref[i], err, mag[i]);
        if (mag[i] > 0 && err / mag[i] > max_err) max_err = err / mag[i];
        sum += got[i];
    }
    printf("info: %s max relative error %.3g\n", what, max_err);
    return sum;
}

int main() {
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    EXPECT(count > 0, "no device");
    printf("info: cudnn version %zu (built against %d.%d.%d)\n", cudnnGetVersion(), CUDNN_MAJOR, CUDNN_MINOR,
           CUDNN_PATCHLEVEL);

    rng g(0xc0417);
    std::vector<float> x(size_t(N) * C * H * W), w(size_t(K) * C * R * S), dy(size_t(N) * K * P * Q);
    for (auto& v : x) v = quantized(g);
    for (auto& v : w) v = quantized(g);
    for (auto& v : dy) v = quantized(g);

    // ------------------------------------------------------------------ descriptors
    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudnnHandle_t handle;
    CHECK_CUDNN(cudnnCreate(&handle));
    CHECK_CUDNN(cudnnSetStream(handle, stream));

    cudnnTensorDescriptor_t xDesc, yDesc;
    cudnnFilterDescriptor_t wDesc;
    cudnnConvolutionDescriptor_t convDesc;
    CHECK_CUDNN(cudnnCreateTensorDescriptor(&xDesc));
    CHECK_CUDNN(cudnnCreateTensorDescriptor(&yDesc));
    CHECK_CUDNN(cudnnCreateFilterDescriptor(&wDesc));
    CHECK_CUDNN(cudnnCreateConvolutionDescriptor(&convDesc));
    CHECK_CUDNN(cudnnSetTensor4dDescriptor(xDesc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, N, C, H, W));
    CHECK_CUDNN(cudnnSetFilter4dDescriptor(wDesc, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, K, C, R, S));
    CHECK_CUDNN(cudnnSetConvolution2dDescriptor(convDesc, PAD, PAD, STRIDE, STRIDE, DIL, DIL,
                                                CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    // The default math lets Ampere and later use TF32 for float convolutions: ask for plain FP32 FMAs.
    CHECK_CUDNN(cudnnSetConvolutionMathType(convDesc, CUDNN_FMA_MATH));
    int on, oc, oh, ow;
    CHECK_CUDNN(cudnnGetConvolution2dForwardOutputDim(convDesc, xDesc, wDesc, &on, &oc, &oh, &ow));
    printf("x %dx%dx%dx%d, w %dx%dx%dx%d, pad %d -> y %dx%dx%dx%d\n", N, C, H, W, K, C, R, S, PAD, on, oc, oh,
           ow);
    EXPECT(on == N && oc == K && oh == P && ow == Q, "output dims %dx%dx%dx%d, expected %dx%dx%dx%d", on, oc,
           oh, ow, N, K, P, Q);
    CHECK_CUDNN(cudnnSetTensor4dDescriptor(yDesc, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, N, K, P, Q));

    // ------------------------------------------------------------------ algorithms and workspaces
    const cudnnConvolutionFwdAlgo_t fwd_algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    const cudnnConvolutionBwdDataAlgo_t bwd_data_algo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
    const cudnnConvolutionBwdFilterAlgo_t bwd_filter_algo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
    size_t ws_fwd = 0, ws_bwd_data = 0, ws_bwd_filter = 0;
    CHECK_ALGO(
        cudnnGetConvolutionForwardWorkspaceSize(handle, xDesc, wDesc, convDesc, yDesc, fwd_algo, &ws_fwd),
        "CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM");
    CHECK_ALGO(cudnnGetConvolutionBackwardDataWorkspaceSize(handle, wDesc, yDesc, convDesc, xDesc,
                                                            bwd_data_algo, &ws_bwd_data),
               "CUDNN_CONVOLUTION_BWD_DATA_ALGO_1");
    CHECK_ALGO(cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, xDesc, yDesc, convDesc, wDesc,
                                                              bwd_filter_algo, &ws_bwd_filter),
               "CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1");
    printf("info: workspace bytes: fwd %zu, bwd data %zu, bwd filter %zu\n", ws_fwd, ws_bwd_data,
           ws_bwd_filter);
    size_t ws_bytes = ws_fwd;
    if (ws_bwd_data > ws_bytes) ws_bytes = ws_bwd_data;
    if (ws_bwd_filter > ws_bytes) ws_bytes = ws_bwd_filter;

    // ------------------------------------------------------------------ device buffers
    float *d_x, *d_w, *d_y, *d_dy, *d_dx, *d_dw;
    void* d_ws = nullptr;
    CHECK(cudaMalloc(&d_x, x.size() * sizeof(float)));
    CHECK(cudaMalloc(&d_w, w.size() * sizeof(float)));
    CHECK(cudaMalloc(&d_y, dy.size() * sizeof(float)));
    CHECK(cudaMalloc(&d_dy, dy.size() * sizeof(float)));
    CHECK(cudaMalloc(&d_dx, x.size() * sizeof(float)));
    CHECK(cudaMalloc(&d_dw, w.size() * sizeof(float)));
    if (ws_bytes) CHECK(cudaMalloc(&d_ws, ws_bytes));
    CHECK(cudaMemcpyAsync(d_x, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
    CHECK(cudaMemcpyAsync(d_w, w.data(), w.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
    CHECK(cudaMemcpyAsync(d_dy, dy.data(), dy.size() * sizeof(float), cudaMemcpyHostToDevice, stream));
    // NaNs in the outputs: beta = 0 must overwrite them.
    CHECK(cudaMemsetAsync(d_y, 0xff, dy.size() * sizeof(float), stream));
    CHECK(cudaMemsetAsync(d_dx, 0xff, x.size() * sizeof(float), stream));
    CHECK(cudaMemsetAsync(d_dw, 0xff, w.size() * sizeof(float), stream));

    // ------------------------------------------------------------------ the three convolutions
    const float one = 1.0f, zero = 0.0f;
    CHECK_CUDNN(cudnnConvolutionForward(handle, &one, xDesc, d_x, wDesc, d_w, convDesc, fwd_algo, d_ws,
                                        ws_fwd, &zero, yDesc, d_y));
    CHECK_CUDNN(cudnnConvolutionBackwardData(handle, &one, wDesc, d_w, yDesc, d_dy, convDesc, bwd_data_algo,
                                             d_ws, ws_bwd_data, &zero, xDesc, d_dx));
    CHECK_CUDNN(cudnnConvolutionBackwardFilter(handle, &one, xDesc, d_x, yDesc, d_dy, convDesc,
                                               bwd_filter_algo, d_ws, ws_bwd_filter, &zero, wDesc, d_dw));
    std::vector<float> y(dy.size()), dx(x.size()), dw(w.size());
    CHECK(cudaMemcpyAsync(y.data(), d_y, y.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaMemcpyAsync(dx.data(), d_dx, dx.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaMemcpyAsync(dw.data(), d_dw, dw.size() * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));

    // ------------------------------------------------------------------ CPU references (cross-correlation)
    std::vector<double> y_ref(y.size(), 0), y_mag(y.size(), 0);
    std::vector<double> dx_ref(dx.size(), 0), dx_mag(dx.size(), 0);
    std::vector<double> dw_ref(dw.size(), 0), dw_mag(dw.size(), 0);
    for (int n = 0; n < N; ++n)
        for (int k = 0; k < K; ++k)
            for (int p = 0; p < P; ++p)
                for (int q = 0; q < Q; ++q)
                    for (int c = 0; c < C; ++c)
                        for (int r = 0; r < R; ++r)
                            for (int s = 0; s < S; ++s) {
                                const int h = p * STRIDE - PAD + r * DIL, ww = q * STRIDE - PAD + s * DIL;
                                if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
                                const double xv = x[xi(n, c, h, ww)], wv = w[wi(k, c, r, s)];
                                const double dyv = dy[yi(n, k, p, q)];
                                y_ref[yi(n, k, p, q)] += xv * wv;
                                y_mag[yi(n, k, p, q)] += std::fabs(xv * wv);
                                dx_ref[xi(n, c, h, ww)] += dyv * wv;
                                dx_mag[xi(n, c, h, ww)] += std::fabs(dyv * wv);
                                dw_ref[wi(k, c, r, s)] += dyv * xv;
                                dw_mag[wi(k, c, r, s)] += std::fabs(dyv * xv);
                            }

    const double y_sum = check("forward", y, y_ref, y_mag);
    printf("forward (implicit gemm): ok, sum = %.4f, y[0] = %.4f, y[last] = %.4f\n", y_sum, y[0],
           y[y.size() - 1]);
    const double dx_sum = check("backward data", dx, dx_ref, dx_mag);
    printf("backward data (algo 1): ok, sum = %.4f, dx[0] = %.4f, dx[last] = %.4f\n", dx_sum, dx[0],
           dx[dx.size() - 1]);
    const double dw_sum = check("backward filter", dw, dw_ref, dw_mag);
    printf("backward filter (algo 1): ok, sum = %.4f, dw[0] = %.4f, dw[last] = %.4f\n", dw_sum, dw[0],
           dw[dw.size() - 1]);

    CHECK_CUDNN(cudnnDestroyConvolutionDescriptor(convDesc));
    CHECK_CUDNN(cudnnDestroyFilterDescriptor(wDesc));
    CHECK_CUDNN(cudnnDestroyTensorDescriptor(yDesc));
    CHECK_CUDNN(cudnnDestroyTensorDescriptor(xDesc));
    CHECK_CUDNN(cudnnDestroy(handle));
    CHECK(cudaStreamDestroy(stream));
    for (void* p : {(void*)d_x, (void*)d_w, (void*)d_y, (void*)d_dy, (void*)d_dx, (void*)d_dw, d_ws})
        if (p) CHECK(cudaFree(p));
    return pass();
}
