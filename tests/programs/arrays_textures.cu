// arrays_textures: CUDA arrays, texture and surface objects, as the CUDA samples simpleTexture and
// simpleSurfaceWrite use them — cudaMallocArray / cudaMalloc3DArray, cudaMemcpy2DToArray / FromArray (to host
// and to device), cudaMemcpy3D into and out of a 3D array (whole and a sub-box), a texture object over an
// array read with tex2D (point filtering at texel centres, clamped at the edge), a surface object written
// with surf2Dwrite and read back, a linear texture over device memory read with tex1Dfetch, and a copy past
// an array's extent refused. Every result is checked against the CPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "common.cuh"

// out[y][x] = 2 * texel(x - 1, y) + 1: x - 1 = -1 is clamped to texel 0.
extern "C" __global__ void at_tex_read(cudaTextureObject_t t, float* out, int w, int h) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < w && y < h) out[y * w + x] = 2.0f * tex2D<float>(t, x - 1 + 0.5f, y + 0.5f) + 1.0f;
}

extern "C" __global__ void at_surf_write(cudaSurfaceObject_t s, int w, int h) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < w && y < h) surf2Dwrite(static_cast<float>(x * 3 + y * 1000), s, x * 4, y);
}

extern "C" __global__ void at_tex1d(cudaTextureObject_t t, float* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = tex1Dfetch<float>(t, i) + static_cast<float>(i);
}

static float texel(int x, int y) { return static_cast<float>(x * 7 + y * 131); }

int main() {
    const int W = 64, H = 48;
    cudaChannelFormatDesc fdesc = cudaCreateChannelDesc<float>();

    // ------------------------------------------------------------------ 2D array, texture object
    std::vector<float> h(size_t(W) * H), out(size_t(W) * H);
    for (int y = 0; y < H; ++y)
        for (int x = 0; x < W; ++x) h[size_t(y) * W + x] = texel(x, y);
    cudaArray_t arr = nullptr;
    CHECK(cudaMallocArray(&arr, &fdesc, W, H));
    CHECK(cudaMemcpy2DToArray(arr, 0, 0, h.data(), W * sizeof(float), W * sizeof(float), H,
                              cudaMemcpyHostToDevice));
    cudaChannelFormatDesc got{};
    cudaExtent ext{};
    unsigned flags = 0;
    CHECK(cudaArrayGetInfo(&got, &ext, &flags, arr));
    EXPECT(got.x == 32 && got.f == cudaChannelFormatKindFloat && ext.width == size_t(W) &&
               ext.height == size_t(H),
           "cudaArrayGetInfo: %d bits, kind %d, %zu x %zu", got.x, int(got.f), ext.width, ext.height);

    cudaResourceDesc res{};
    res.resType = cudaResourceTypeArray;
    res.res.array.array = arr;
    cudaTextureDesc td{};
    td.addressMode[0] = cudaAddressModeClamp;
    td.addressMode[1] = cudaAddressModeClamp;
    td.filterMode = cudaFilterModePoint;
    td.readMode = cudaReadModeElementType;
    td.normalizedCoords = 0;
    cudaTextureObject_t tex = 0;
    CHECK(cudaCreateTextureObject(&tex, &res, &td, nullptr));
    cudaResourceDesc back{};
    CHECK(cudaGetTextureObjectResourceDesc(&back, tex));
    EXPECT(back.resType == cudaResourceTypeArray && back.res.array.array == arr,
           "cudaGetTextureObjectResourceDesc: another resource");
    cudaTextureDesc tback{};
    CHECK(cudaGetTextureObjectTextureDesc(&tback, tex));
    EXPECT(tback.addressMode[0] == td.addressMode[0] && tback.addressMode[1] == td.addressMode[1] &&
               tback.filterMode == td.filterMode && tback.readMode == td.readMode &&
               tback.normalizedCoords == td.normalizedCoords,
           "cudaGetTextureObjectTextureDesc: another descriptor");
    cudaResourceViewDesc vback{};
    printf("texture object's texture descriptor: as created; its resource view (none given): %s\n",
           cudaGetErrorName(cudaGetTextureObjectResourceViewDesc(&vback, tex)));
    (void)cudaGetLastError();  // that error, not a launch's

    float* dout = nullptr;
    CHECK(cudaMalloc(&dout, sizeof(float) * W * H));
    dim3 b(16, 16), g((W + 15) / 16, (H + 15) / 16);
    at_tex_read<<<g, b>>>(tex, dout, W, H);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(out.data(), dout, sizeof(float) * W * H, cudaMemcpyDeviceToHost));
    for (int y = 0; y < H; ++y)
        for (int x = 0; x < W; ++x) {
            float want = 2.0f * texel(x > 0 ? x - 1 : 0, y) + 1.0f;
            if (out[size_t(y) * W + x] != want)
                fail("tex2D: (%d, %d) = %g, expected %g", x, y, out[size_t(y) * W + x], want);
        }
    printf("texture object over a %dx%d float array, tex2D: ok\n", W, H);

    // Back out of the array, to the host and to pitched device memory.
    std::vector<float> round(size_t(W) * H);
    CHECK(cudaMemcpy2DFromArray(round.data(), W * sizeof(float), arr, 0, 0, W * sizeof(float), H,
                                cudaMemcpyDeviceToHost));
    EXPECT(round == h, "cudaMemcpy2DFromArray to the host differs");
    float* pitched = nullptr;
    size_t pitch = 0;
    CHECK(cudaMallocPitch(&pitched, &pitch, W * sizeof(float), H));
    CHECK(cudaMemcpy2DFromArray(pitched, pitch, arr, 0, 0, W * sizeof(float), H, cudaMemcpyDeviceToDevice));
    std::fill(round.begin(), round.end(), 0.0f);
    CHECK(cudaMemcpy2D(round.data(), W * sizeof(float), pitched, pitch, W * sizeof(float), H,
                       cudaMemcpyDeviceToHost));
    EXPECT(round == h, "cudaMemcpy2DFromArray to device memory differs");
    // A sub-rectangle: 10 x 5 elements from (3, 7).
    std::vector<float> sub(10 * 5);
    CHECK(cudaMemcpy2DFromArray(sub.data(), 10 * sizeof(float), arr, 3 * sizeof(float), 7, 10 * sizeof(float),
                                5, cudaMemcpyDeviceToHost));
    for (int y = 0; y < 5; ++y)
        for (int x = 0; x < 10; ++x)
            EXPECT(sub[size_t(y) * 10 + x] == texel(x + 3, y + 7), "sub-rectangle (%d, %d)", x, y);
    printf("cudaMemcpy2DFromArray to host, to device, a sub-rectangle: ok\n");

    // Past the array's width: refused, nothing else affected.
    cudaError_t e = cudaMemcpy2DToArray(arr, (W - 4) * sizeof(float), 0, h.data(), W * sizeof(float),
                                        8 * sizeof(float), 1, cudaMemcpyHostToDevice);
    EXPECT(e != cudaSuccess, "a copy past the array's width succeeded");
    cudaGetLastError();
    printf("copy past the array's extent refused\n");

    // ------------------------------------------------------------------ surface object
    cudaArray_t sarr = nullptr;
    CHECK(cudaMallocArray(&sarr, &fdesc, W, H, cudaArraySurfaceLoadStore));
    cudaResourceDesc sres{};
    sres.resType = cudaResourceTypeArray;
    sres.res.array.array = sarr;
    cudaSurfaceObject_t surf = 0;
    CHECK(cudaCreateSurfaceObject(&surf, &sres));
    cudaResourceDesc sback{};
    CHECK(cudaGetSurfaceObjectResourceDesc(&sback, surf));
    EXPECT(sback.resType == cudaResourceTypeArray && sback.res.array.array == sarr,
           "cudaGetSurfaceObjectResourceDesc: another resource");
    EXPECT(cudaGetTextureObjectResourceDesc(&sback, surf) != cudaSuccess || surf == tex,
           "a surface object answered as a texture object");
    (void)cudaGetLastError();  // that refusal, not a launch's
    at_surf_write<<<g, b>>>(surf, W, H);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy2DFromArray(round.data(), W * sizeof(float), sarr, 0, 0, W * sizeof(float), H,
                                cudaMemcpyDeviceToHost));
    for (int y = 0; y < H; ++y)
        for (int x = 0; x < W; ++x)
            if (round[size_t(y) * W + x] != static_cast<float>(x * 3 + y * 1000))
                fail("surf2Dwrite: (%d, %d) = %g", x, y, round[size_t(y) * W + x]);
    printf("surface object, surf2Dwrite then cudaMemcpy2DFromArray: ok\n");

    // ------------------------------------------------------------------ 3D array
    const int X = 16, Y = 8, Z = 4;
    std::vector<int> v(size_t(X) * Y * Z), v2(v.size(), -1);
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int>(i * 3 + 1);
    cudaChannelFormatDesc idesc = cudaCreateChannelDesc<int>();
    cudaArray_t arr3 = nullptr;
    CHECK(cudaMalloc3DArray(&arr3, &idesc, make_cudaExtent(X, Y, Z)));
    cudaMemcpy3DParms p{};
    p.srcPtr = make_cudaPitchedPtr(v.data(), X * sizeof(int), X, Y);
    p.dstArray = arr3;
    p.extent = make_cudaExtent(X, Y, Z);
    p.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&p));
    cudaMemcpy3DParms q{};
    q.srcArray = arr3;
    q.dstPtr = make_cudaPitchedPtr(v2.data(), X * sizeof(int), X, Y);
    q.extent = make_cudaExtent(X, Y, Z);
    q.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3D(&q));
    EXPECT(v2 == v, "cudaMemcpy3D into and out of a 3D array differs");
    // A 4 x 2 x 2 box from (2, 3, 1), asynchronously.
    std::vector<int> box(4 * 2 * 2, -1);
    cudaMemcpy3DParms r{};
    r.srcArray = arr3;
    r.srcPos = make_cudaPos(2, 3, 1);
    r.dstPtr = make_cudaPitchedPtr(box.data(), 4 * sizeof(int), 4, 2);
    r.extent = make_cudaExtent(4, 2, 2);
    r.kind = cudaMemcpyDeviceToHost;
    cudaStream_t st;
    CHECK(cudaStreamCreate(&st));
    CHECK(cudaMemcpy3DAsync(&r, st));
    CHECK(cudaStreamSynchronize(st));
    for (int z = 0; z < 2; ++z)
        for (int y = 0; y < 2; ++y)
            for (int x = 0; x < 4; ++x)
                EXPECT(box[size_t(z * 2 + y) * 4 + x] == v[size_t((z + 1) * Y + (y + 3)) * X + (x + 2)],
                       "3D sub-box (%d, %d, %d)", x, y, z);
    printf("cudaMemcpy3D with a %dx%dx%d int array, whole and a sub-box: ok\n", X, Y, Z);

    // ------------------------------------------------------------------ linear texture, tex1Dfetch
    const int N = 1000;
    std::vector<float> lin(N), lout(N);
    for (int i = 0; i < N; ++i) lin[i] = static_cast<float>(i) * 0.5f;
    float* dlin = nullptr;
    CHECK(cudaMalloc(&dlin, sizeof(float) * N));
    CHECK(cudaMemcpy(dlin, lin.data(), sizeof(float) * N, cudaMemcpyHostToDevice));
    cudaResourceDesc lres{};
    lres.resType = cudaResourceTypeLinear;
    lres.res.linear.devPtr = dlin;
    lres.res.linear.desc = fdesc;
    lres.res.linear.sizeInBytes = sizeof(float) * N;
    cudaTextureDesc ltd{};
    ltd.readMode = cudaReadModeElementType;
    cudaTextureObject_t ltex = 0;
    CHECK(cudaCreateTextureObject(&ltex, &lres, &ltd, nullptr));
    at_tex1d<<<(N + 127) / 128, 128>>>(ltex, dout, N);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy(lout.data(), dout, sizeof(float) * N, cudaMemcpyDeviceToHost));
    for (int i = 0; i < N; ++i)
        EXPECT(lout[i] == lin[i] + static_cast<float>(i), "tex1Dfetch %d = %g", i, lout[i]);
    printf("linear texture over device memory, tex1Dfetch: ok\n");

    CHECK(cudaDestroyTextureObject(ltex));
    CHECK(cudaDestroyTextureObject(tex));
    CHECK(cudaDestroySurfaceObject(surf));
    CHECK(cudaStreamDestroy(st));
    CHECK(cudaFreeArray(arr));
    CHECK(cudaFreeArray(sarr));
    CHECK(cudaFreeArray(arr3));
    CHECK(cudaFree(dlin));
    CHECK(cudaFree(dout));
    CHECK(cudaFree(pitched));
    return pass();
}
