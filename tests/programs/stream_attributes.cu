// stream_attributes: stream and kernel-node attributes as the CUDA sample simpleAttributes uses them — a
// persisting-L2 limit, an access policy window over device memory set on a stream (cudaStreamSetAttribute)
// and read back, the stream's work still right, the persisting lines reset (cudaCtxResetPersistingL2Cache);
// a synchronization policy; the attributes copied to another stream; a window past the device's limit
// refused; the same window on a kernel node of a graph (set, read back, copied to a second node) and the
// graph's result.
#include <cuda_runtime.h>

#include <vector>

#include "common.cuh"

extern "C" __global__ void sa_scale(int* p, int n, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = p[i] * k + 1;
}

static void check_window(const cudaAccessPolicyWindow& got, const cudaAccessPolicyWindow& want,
                         const char* what) {
    EXPECT(got.base_ptr == want.base_ptr && got.num_bytes == want.num_bytes && got.hitProp == want.hitProp &&
               got.missProp == want.missProp,
           "%s: read back another window (%zu bytes, hit %d, miss %d)", what, got.num_bytes, int(got.hitProp),
           int(got.missProp));
    printf("%s: %zu bytes, hit ratio %.2f, hit %d, miss %d\n", what, got.num_bytes, got.hitRatio,
           int(got.hitProp), int(got.missProp));
}

int main() {
    cudaDeviceProp prop{};
    CHECK(cudaGetDeviceProperties(&prop, 0));
    EXPECT(prop.accessPolicyMaxWindowSize > 0, "the device reports no access policy window");
    CHECK(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, prop.persistingL2CacheMaxSize));
    size_t limit = 0;
    CHECK(cudaDeviceGetLimit(&limit, cudaLimitPersistingL2CacheSize));
    EXPECT(limit > 0, "persisting L2 limit %zu", limit);

    const int n = 1 << 16;
    std::vector<int> h(n), back(n);
    for (int i = 0; i < n; ++i) h[i] = i % 1000;
    int* d = nullptr;
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));

    // A fresh stream's window is empty.
    cudaStreamAttrValue v{};
    CHECK(cudaStreamGetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &v));
    EXPECT(v.accessPolicyWindow.num_bytes == 0, "a new stream has a window of %zu bytes",
           v.accessPolicyWindow.num_bytes);

    cudaAccessPolicyWindow w{};
    w.base_ptr = d;
    w.num_bytes = n * sizeof(int);
    w.hitRatio = 0.5f;
    w.hitProp = cudaAccessPropertyPersisting;
    w.missProp = cudaAccessPropertyStreaming;
    v = {};
    v.accessPolicyWindow = w;
    CHECK(cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &v));
    cudaStreamAttrValue got{};
    CHECK(cudaStreamGetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &got));
    check_window(got.accessPolicyWindow, w, "stream access policy window");

    CHECK(cudaMemcpyAsync(d, h.data(), n * sizeof(int), cudaMemcpyHostToDevice, s));
    sa_scale<<<(n + 255) / 256, 256, 0, s>>>(d, n, 3);
    CHECK_LAUNCH();
    CHECK(cudaMemcpyAsync(back.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; ++i) EXPECT(back[i] == h[i] * 3 + 1, "stream result [%d] = %d", i, back[i]);
    CHECK(cudaCtxResetPersistingL2Cache());
    printf("kernel on the stream with the window: ok; persisting lines reset\n");

    // The synchronization policy.
    v = {};
    v.syncPolicy = cudaSyncPolicyYield;
    CHECK(cudaStreamSetAttribute(s, cudaStreamAttributeSynchronizationPolicy, &v));
    got = {};
    CHECK(cudaStreamGetAttribute(s, cudaStreamAttributeSynchronizationPolicy, &got));
    EXPECT(got.syncPolicy == cudaSyncPolicyYield, "synchronization policy %d", int(got.syncPolicy));
    printf("synchronization policy %d\n", int(got.syncPolicy));

    // Copied to another stream.
    cudaStream_t s2;
    CHECK(cudaStreamCreate(&s2));
    CHECK(cudaStreamCopyAttributes(s2, s));
    got = {};
    CHECK(cudaStreamGetAttribute(s2, cudaStreamAttributeAccessPolicyWindow, &got));
    check_window(got.accessPolicyWindow, w, "copied to another stream");

    // A window larger than the device allows is refused, the stream's own unchanged.
    v = {};
    v.accessPolicyWindow = w;
    v.accessPolicyWindow.num_bytes = size_t(prop.accessPolicyMaxWindowSize) + 4096;
    cudaError_t e = cudaStreamSetAttribute(s2, cudaStreamAttributeAccessPolicyWindow, &v);
    EXPECT(e != cudaSuccess, "a window past the device's limit was accepted");
    cudaGetLastError();
    printf("window past the limit: %s\n", cudaGetErrorName(e));
    got = {};
    CHECK(cudaStreamGetAttribute(s2, cudaStreamAttributeAccessPolicyWindow, &got));
    check_window(got.accessPolicyWindow, w, "after the refusal");

    // Kernel nodes of a graph.
    cudaGraph_t g;
    CHECK(cudaGraphCreate(&g, 0));
    int k1 = 2, k2 = 5, nn = n;
    void* args1[] = {&d, &nn, &k1};
    void* args2[] = {&d, &nn, &k2};
    cudaKernelNodeParams kp{};
    kp.func = reinterpret_cast<void*>(sa_scale);
    kp.gridDim = dim3((n + 255) / 256);
    kp.blockDim = dim3(256);
    kp.kernelParams = args1;
    cudaGraphNode_t a, b;
    CHECK(cudaGraphAddKernelNode(&a, g, nullptr, 0, &kp));
    kp.kernelParams = args2;
    CHECK(cudaGraphAddKernelNode(&b, g, &a, 1, &kp));
    cudaKernelNodeAttrValue kv{};
    kv.accessPolicyWindow = w;
    CHECK(cudaGraphKernelNodeSetAttribute(a, cudaKernelNodeAttributeAccessPolicyWindow, &kv));
    cudaKernelNodeAttrValue kgot{};
    CHECK(cudaGraphKernelNodeGetAttribute(a, cudaKernelNodeAttributeAccessPolicyWindow, &kgot));
    check_window(kgot.accessPolicyWindow, w, "kernel node access policy window");
    CHECK(cudaGraphKernelNodeCopyAttributes(b, a));
    kgot = {};
    CHECK(cudaGraphKernelNodeGetAttribute(b, cudaKernelNodeAttributeAccessPolicyWindow, &kgot));
    check_window(kgot.accessPolicyWindow, w, "copied to the second node");

    cudaGraphExec_t x;
    CHECK(cudaGraphInstantiate(&x, g, 0));
    CHECK(cudaMemcpy(d, h.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaGraphLaunch(x, s));
    CHECK(cudaMemcpyAsync(back.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; ++i)
        EXPECT(back[i] == (h[i] * 2 + 1) * 5 + 1, "graph result [%d] = %d", i, back[i]);
    printf("graph with the window on its kernel nodes: ok\n");

    CHECK(cudaGraphExecDestroy(x));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaStreamDestroy(s2));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(d));
    return pass();
}
