// linear_textures: texture objects over linear device memory as the CUDA sample convolutionFFT2D makes them —
// a float2 channel format (cudaCreateChannelDesc<float2>), element reads, point filtering — including a
// texture whose size covers padding its source allocation does not have (the sample's spPostprocess2D sizes
// its texture by the padded destination). The kernel reads only the allocation's elements; every value is
// checked, and the resource descriptor reads back as given. Then float4 and int2 formats over exact sizes.
#include <cuda_runtime.h>

#include <vector>

#include "common.cuh"

extern "C" __global__ void lt_fetch2(cudaTextureObject_t t, float2* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float2 v = tex1Dfetch<float2>(t, i);
        out[i] = make_float2(v.x * 2.0f, v.y - 1.0f);
    }
}

extern "C" __global__ void lt_fetch4(cudaTextureObject_t t, float4* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = tex1Dfetch<float4>(t, i);
}

extern "C" __global__ void lt_fetch_int2(cudaTextureObject_t t, int2* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = tex1Dfetch<int2>(t, i);
}

static cudaTextureObject_t linear_texture(void* p, size_t bytes, cudaChannelFormatDesc desc) {
    cudaResourceDesc res{};
    res.resType = cudaResourceTypeLinear;
    res.res.linear.devPtr = p;
    res.res.linear.sizeInBytes = bytes;
    res.res.linear.desc = desc;
    cudaTextureDesc td{};
    td.normalizedCoords = 0;
    td.filterMode = cudaFilterModePoint;
    td.addressMode[0] = cudaAddressModeWrap;
    td.readMode = cudaReadModeElementType;
    cudaTextureObject_t t = 0;
    CHECK(cudaCreateTextureObject(&t, &res, &td, nullptr));
    return t;
}

// A float2 texture over `rows` x `cols` elements whose size claims `rows` x (`cols` + `padding`).
static void padded_float2(int rows, int cols, int padding, const char* what) {
    const int n = rows * cols;
    std::vector<float2> h(n), out(n);
    rng r(uint64_t(n) * 31 + padding);
    for (auto& v : h) v = make_float2(r.unit() * 100.0f, r.unit() - 0.5f);
    float2 *src = nullptr, *dst = nullptr;
    CHECK(cudaMalloc(&src, sizeof(float2) * n));
    CHECK(cudaMalloc(&dst, sizeof(float2) * n));
    CHECK(cudaMemcpy(src, h.data(), sizeof(float2) * n, cudaMemcpyHostToDevice));
    const size_t claimed = sizeof(float2) * size_t(rows) * size_t(cols + padding);
    cudaTextureObject_t t = linear_texture(src, claimed, cudaCreateChannelDesc<float2>());
    cudaResourceDesc back{};
    CHECK(cudaGetTextureObjectResourceDesc(&back, t));
    EXPECT(back.resType == cudaResourceTypeLinear && back.res.linear.devPtr == src &&
               back.res.linear.sizeInBytes == claimed && back.res.linear.desc.x == 32 &&
               back.res.linear.desc.y == 32 && back.res.linear.desc.z == 0,
           "%s: the resource descriptor reads back as %zu bytes, %d/%d/%d bits", what,
           back.res.linear.sizeInBytes, back.res.linear.desc.x, back.res.linear.desc.y,
           back.res.linear.desc.z);
    lt_fetch2<<<(n + 255) / 256, 256>>>(t, dst, n);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(out.data(), dst, sizeof(float2) * n, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i)
        EXPECT(out[i].x == h[i].x * 2.0f && out[i].y == h[i].y - 1.0f, "%s: element %d = (%g, %g)", what, i,
               out[i].x, out[i].y);
    printf("%s: %d x %d float2 under a texture of %zu bytes: ok (digest %016llx)\n", what, rows, cols,
           claimed, static_cast<unsigned long long>(fnv1a(out.data(), sizeof(float2) * n)));
    CHECK(cudaDestroyTextureObject(t));
    CHECK(cudaFree(dst));
    CHECK(cudaFree(src));
}

int main() {
    padded_float2(40, 75, 16, "small allocation, padded texture");
    padded_float2(256, 1024, 16, "large allocation, padded texture");
    padded_float2(64, 64, 0, "exact size");

    const int n = 5000;
    std::vector<float4> h4(n), o4(n);
    for (int i = 0; i < n; ++i) h4[i] = make_float4(i, -i, i * 0.5f, 7.0f);
    float4 *s4 = nullptr, *d4 = nullptr;
    CHECK(cudaMalloc(&s4, sizeof(float4) * n));
    CHECK(cudaMalloc(&d4, sizeof(float4) * n));
    CHECK(cudaMemcpy(s4, h4.data(), sizeof(float4) * n, cudaMemcpyHostToDevice));
    cudaTextureObject_t t4 = linear_texture(s4, sizeof(float4) * n, cudaCreateChannelDesc<float4>());
    lt_fetch4<<<(n + 255) / 256, 256>>>(t4, d4, n);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(o4.data(), d4, sizeof(float4) * n, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i)
        EXPECT(o4[i].x == h4[i].x && o4[i].y == h4[i].y && o4[i].z == h4[i].z && o4[i].w == h4[i].w,
               "float4 element %d", i);
    printf("float4 linear texture: ok\n");

    std::vector<int2> hi(n), oi(n);
    for (int i = 0; i < n; ++i) hi[i] = make_int2(i * 3, -i);
    int2 *si = nullptr, *di = nullptr;
    CHECK(cudaMalloc(&si, sizeof(int2) * n));
    CHECK(cudaMalloc(&di, sizeof(int2) * n));
    CHECK(cudaMemcpy(si, hi.data(), sizeof(int2) * n, cudaMemcpyHostToDevice));
    cudaTextureObject_t ti = linear_texture(si, sizeof(int2) * n, cudaCreateChannelDesc<int2>());
    lt_fetch_int2<<<(n + 255) / 256, 256>>>(ti, di, n);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(oi.data(), di, sizeof(int2) * n, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) EXPECT(oi[i].x == hi[i].x && oi[i].y == hi[i].y, "int2 element %d", i);
    printf("int2 linear texture: ok\n");

    CHECK(cudaDestroyTextureObject(t4));
    CHECK(cudaDestroyTextureObject(ti));
    CHECK(cudaFree(s4));
    CHECK(cudaFree(d4));
    CHECK(cudaFree(si));
    CHECK(cudaFree(di));
    return pass();
}
