// mipmapped_arrays: a mipmapped CUDA array as a texture's levels and as surfaces, the way mipmap generation
// uses it — cudaMallocMipmappedArray, cudaGetMipmappedArrayLevel (each level's extent checked),
// cudaMemcpy2DToArray / FromArray on levels, a surface object over one level written with surf2Dwrite, a
// texture object over the whole mipmapped array read with tex2DLod at every level (point filtering at texel
// centres), and a level out of range refused. Every result is checked against the CPU.
#include <cuda_runtime.h>

#include <vector>

#include "common.cuh"

// out[y][x] = the texel at (x, y) of level `level`, read through normalized coordinates.
extern "C" __global__ void mm_tex_lod(cudaTextureObject_t t, float* out, int level, int w, int h) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < w && y < h)
        out[y * w + x] = tex2DLod<float>(t, (x + 0.5f) / w, (y + 0.5f) / h, static_cast<float>(level));
}

// Writes base + x + y * w into every texel of a level through its surface object.
extern "C" __global__ void mm_surf_write(cudaSurfaceObject_t s, int w, int h, float base) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < w && y < h) surf2Dwrite(base + static_cast<float>(x + y * w), s, x * 4, y);
}

static float texel(int level, int x, int y) { return static_cast<float>(level * 10000 + y * 100 + x); }

int main() {
    const int W = 64, H = 32, LEVELS = 5;  // 64x32, 32x16, 16x8, 8x4, 4x2
    const int SURFACE_LEVEL = 2;
    cudaChannelFormatDesc fdesc = cudaCreateChannelDesc<float>();
    cudaMipmappedArray_t mm = nullptr;
    CHECK(cudaMallocMipmappedArray(&mm, &fdesc, make_cudaExtent(W, H, 0), LEVELS, cudaArraySurfaceLoadStore));

    std::vector<cudaArray_t> level(LEVELS);
    for (int l = 0; l < LEVELS; ++l) {
        CHECK(cudaGetMipmappedArrayLevel(&level[l], mm, l));
        cudaChannelFormatDesc got{};
        cudaExtent ext{};
        unsigned flags = 0;
        CHECK(cudaArrayGetInfo(&got, &ext, &flags, level[l]));
        EXPECT(ext.width == size_t(W >> l) && ext.height == size_t(H >> l) && got.x == 32,
               "level %d is %zu x %zu (%d bits), expected %d x %d", l, ext.width, ext.height, got.x, W >> l,
               H >> l);
        if (l == SURFACE_LEVEL) continue;  // written by a kernel below
        const int w = W >> l, h = H >> l;
        std::vector<float> v(size_t(w) * h);
        for (int y = 0; y < h; ++y)
            for (int x = 0; x < w; ++x) v[size_t(y) * w + x] = texel(l, x, y);
        CHECK(cudaMemcpy2DToArray(level[l], 0, 0, v.data(), w * sizeof(float), w * sizeof(float), h,
                                  cudaMemcpyHostToDevice));
    }
    cudaArray_t again = nullptr;
    CHECK(cudaGetMipmappedArrayLevel(&again, mm, 1));
    EXPECT(again == level[1], "cudaGetMipmappedArrayLevel gave level 1 as two arrays");
    cudaArray_t none = nullptr;
    cudaError_t past = cudaGetMipmappedArrayLevel(&none, mm, LEVELS);
    EXPECT(past != cudaSuccess, "level %d of a %d-level array was given", LEVELS, LEVELS);
    cudaGetLastError();
    printf("mipmapped array of %d levels, %dx%d down to %dx%d: ok\n", LEVELS, W, H, W >> (LEVELS - 1),
           H >> (LEVELS - 1));

    // A surface over one level, written by a kernel, read back by a copy.
    const int sw = W >> SURFACE_LEVEL, sh = H >> SURFACE_LEVEL;
    cudaResourceDesc sres{};
    sres.resType = cudaResourceTypeArray;
    sres.res.array.array = level[SURFACE_LEVEL];
    cudaSurfaceObject_t surf = 0;
    CHECK(cudaCreateSurfaceObject(&surf, &sres));
    mm_surf_write<<<dim3((sw + 7) / 8, (sh + 7) / 8), dim3(8, 8)>>>(
        surf, sw, sh, static_cast<float>(SURFACE_LEVEL * 10000));
    CHECK_LAUNCH();
    std::vector<float> sback(size_t(sw) * sh);
    CHECK(cudaMemcpy2DFromArray(sback.data(), sw * sizeof(float), level[SURFACE_LEVEL], 0, 0,
                                sw * sizeof(float), sh, cudaMemcpyDeviceToHost));
    for (int y = 0; y < sh; ++y)
        for (int x = 0; x < sw; ++x)
            EXPECT(sback[size_t(y) * sw + x] == static_cast<float>(SURFACE_LEVEL * 10000 + x + y * sw),
                   "surface level %d (%d, %d) = %g", SURFACE_LEVEL, x, y, sback[size_t(y) * sw + x]);
    printf("surf2Dwrite into level %d, read back: ok\n", SURFACE_LEVEL);

    // A texture over the whole mipmapped array, every level read with tex2DLod.
    cudaResourceDesc res{};
    res.resType = cudaResourceTypeMipmappedArray;
    res.res.mipmap.mipmap = mm;
    cudaTextureDesc td{};
    td.addressMode[0] = cudaAddressModeClamp;
    td.addressMode[1] = cudaAddressModeClamp;
    td.filterMode = cudaFilterModePoint;
    td.mipmapFilterMode = cudaFilterModePoint;
    td.readMode = cudaReadModeElementType;
    td.normalizedCoords = 1;
    td.maxMipmapLevelClamp = static_cast<float>(LEVELS - 1);
    cudaTextureObject_t tex = 0;
    CHECK(cudaCreateTextureObject(&tex, &res, &td, nullptr));
    float* dout = nullptr;
    CHECK(cudaMalloc(&dout, sizeof(float) * W * H));
    for (int l = 0; l < LEVELS; ++l) {
        const int w = W >> l, h = H >> l;
        mm_tex_lod<<<dim3((w + 7) / 8, (h + 7) / 8), dim3(8, 8)>>>(tex, dout, l, w, h);
        CHECK_LAUNCH();
        std::vector<float> out(size_t(w) * h);
        CHECK(cudaMemcpy(out.data(), dout, sizeof(float) * w * h, cudaMemcpyDeviceToHost));
        for (int y = 0; y < h; ++y)
            for (int x = 0; x < w; ++x) {
                float want = l == SURFACE_LEVEL ? static_cast<float>(l * 10000 + x + y * w) : texel(l, x, y);
                EXPECT(out[size_t(y) * w + x] == want, "tex2DLod level %d (%d, %d) = %g, expected %g", l, x,
                       y, out[size_t(y) * w + x], want);
            }
    }
    printf("tex2DLod over the mipmapped array, every level: ok\n");

    CHECK(cudaDestroyTextureObject(tex));
    CHECK(cudaDestroySurfaceObject(surf));
    CHECK(cudaFreeMipmappedArray(mm));
    CHECK(cudaFree(dout));
    return pass();
}
