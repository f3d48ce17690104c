// copies_2d_3d: pitched memory and strided copies — cudaMallocPitch, cudaMemcpy2D in every direction with
// host and device pitches that differ, a sub-rectangle, cudaMemcpy2DAsync; cudaMalloc3D, cudaMemcpy3D
// host-to-device, device-to-device, device-to-host of a sub-box and into a padded host layout, and into a
// sub-box of the device volume; kernels that address rows and slices through the pitch.
#include <cuda_runtime.h>

#include <vector>

#include "common.cuh"

extern "C" __global__ void c23_add_rows(unsigned char* base, size_t pitch, int width, int height) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < width && y < height) base[y * pitch + x] += static_cast<unsigned char>(y + 3 * x);
}

extern "C" __global__ void c23_scale3d(float* base, size_t pitch, size_t slice_pitch, int w, int h, int d,
                                       float s) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    int z = blockIdx.z * blockDim.z + threadIdx.z;
    if (x < w && y < h && z < d) {
        float* row = reinterpret_cast<float*>(reinterpret_cast<char*>(base) + z * slice_pitch + y * pitch);
        row[x] = row[x] * s + static_cast<float>(z);
    }
}

static unsigned char src2d(int x, int y) { return static_cast<unsigned char>((x * 7 + y * 13) & 0xff); }
static unsigned char after2d(int x, int y) { return static_cast<unsigned char>(src2d(x, y) + y + 3 * x); }
static float src3d(int x, int y, int z) { return static_cast<float>(x + 1000 * y + 100000 * z); }
static float after3d(int x, int y, int z) { return src3d(x, y, z) * 2.0f + static_cast<float>(z); }

int main() {
    // ------------------------------------------------------------------ 2D
    const int W = 1000, H = 37, HP = 1100;  // width in bytes, rows, host pitch
    std::vector<unsigned char> hsrc(size_t(HP) * H, 0xEE), hdst(size_t(W) * H);
    for (int y = 0; y < H; ++y)
        for (int x = 0; x < W; ++x) hsrc[size_t(y) * HP + x] = src2d(x, y);

    unsigned char *p1, *p2, *lin;
    size_t pitch1 = 0, pitch2 = 0;
    CHECK(cudaMallocPitch(&p1, &pitch1, W, H));
    CHECK(cudaMallocPitch(&p2, &pitch2, W / 2 + W, H));  // a different (wider) pitch
    CHECK(cudaMalloc(&lin, size_t(W) * H));
    printf("pitches: %zu and %zu\n", pitch1, pitch2);
    EXPECT(pitch1 >= size_t(W) && pitch2 >= size_t(W + W / 2), "pitch too small");

    CHECK(cudaMemcpy2D(p1, pitch1, hsrc.data(), HP, W, H, cudaMemcpyHostToDevice));
    dim3 b2(32, 8), g2((W + 31) / 32, (H + 7) / 8);
    c23_add_rows<<<g2, b2>>>(p1, pitch1, W, H);
    CHECK_LAUNCH();
    CHECK(cudaMemcpy2D(p2, pitch2, p1, pitch1, W, H, cudaMemcpyDeviceToDevice));
    CHECK(cudaMemcpy2D(hdst.data(), W, p2, pitch2, W, H, cudaMemcpyDeviceToHost));
    for (int y = 0; y < H; ++y)
        for (int x = 0; x < W; ++x)
            if (hdst[size_t(y) * W + x] != after2d(x, y))
                fail("2D HtoD/kernel/DtoD/DtoH: (%d, %d) = %d, expected %d", x, y, hdst[size_t(y) * W + x],
                     after2d(x, y));
    printf("cudaMemcpy2D HtoD -> kernel -> DtoD -> DtoH: ok (fnv %016llx)\n",
           static_cast<unsigned long long>(fnv1a(hdst.data(), hdst.size())));

    // A sub-rectangle: 512 bytes from column 16 of rows 5..24.
    {
        std::vector<unsigned char> sub(512 * 20);
        CHECK(cudaMemcpy2D(sub.data(), 512, p2 + 5 * pitch2 + 16, pitch2, 512, 20, cudaMemcpyDeviceToHost));
        for (int y = 0; y < 20; ++y)
            for (int x = 0; x < 512; ++x)
                EXPECT(sub[y * 512 + x] == after2d(x + 16, y + 5), "sub-rectangle (%d, %d)", x, y);
        printf("cudaMemcpy2D sub-rectangle: ok\n");
    }

    // Pitched to linear on the device, then a plain 1D copy back.
    {
        CHECK(cudaMemcpy2D(lin, W, p1, pitch1, W, H, cudaMemcpyDeviceToDevice));
        std::vector<unsigned char> flat(size_t(W) * H);
        CHECK(cudaMemcpy(flat.data(), lin, flat.size(), cudaMemcpyDeviceToHost));
        EXPECT(flat == hdst, "pitched -> linear copy differs");
        printf("cudaMemcpy2D pitched -> linear: ok\n");
    }

    // Async 2D: host rows into the middle of p1, back out through a stream.
    {
        cudaStream_t s;
        CHECK(cudaStreamCreate(&s));
        std::vector<unsigned char> rows(300 * 10), back(size_t(W) * H);
        for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<unsigned char>(i * 31 + 1);
        CHECK(cudaMemcpy2DAsync(p1 + 20 * pitch1 + 200, pitch1, rows.data(), 300, 300, 10,
                                cudaMemcpyHostToDevice, s));
        CHECK(cudaMemcpy2DAsync(back.data(), W, p1, pitch1, W, H, cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        for (int y = 0; y < H; ++y)
            for (int x = 0; x < W; ++x) {
                unsigned char want = after2d(x, y);
                if (y >= 20 && y < 30 && x >= 200 && x < 500) want = rows[(y - 20) * 300 + (x - 200)];
                if (back[size_t(y) * W + x] != want) fail("cudaMemcpy2DAsync: (%d, %d)", x, y);
            }
        printf("cudaMemcpy2DAsync: ok\n");
        CHECK(cudaStreamDestroy(s));
    }

    // ------------------------------------------------------------------ 3D
    const int w = 123, h = 17, d = 9;
    std::vector<float> hvol(size_t(w) * h * d);
    for (int z = 0; z < d; ++z)
        for (int y = 0; y < h; ++y)
            for (int x = 0; x < w; ++x) hvol[(size_t(z) * h + y) * w + x] = src3d(x, y, z);

    cudaExtent ext = make_cudaExtent(w * sizeof(float), h, d);
    cudaPitchedPtr v1, v2;
    CHECK(cudaMalloc3D(&v1, ext));
    CHECK(cudaMalloc3D(&v2, ext));
    printf("cudaMalloc3D(%zu, %zu, %zu): pitch %zu, xsize %zu, ysize %zu\n", ext.width, ext.height, ext.depth,
           v1.pitch, v1.xsize, v1.ysize);
    EXPECT(v1.pitch >= ext.width, "3D pitch too small");

    {
        cudaMemcpy3DParms p = {};
        p.srcPtr = make_cudaPitchedPtr(hvol.data(), w * sizeof(float), w, h);
        p.dstPtr = v1;
        p.extent = ext;
        p.kind = cudaMemcpyHostToDevice;
        CHECK(cudaMemcpy3D(&p));
    }
    dim3 b3(32, 4, 2), g3((w + 31) / 32, (h + 3) / 4, (d + 1) / 2);
    c23_scale3d<<<g3, b3>>>(static_cast<float*>(v1.ptr), v1.pitch, v1.pitch * h, w, h, d, 2.0f);
    CHECK_LAUNCH();
    {
        cudaMemcpy3DParms p = {};
        p.srcPtr = v1;
        p.dstPtr = v2;
        p.extent = ext;
        p.kind = cudaMemcpyDeviceToDevice;
        CHECK(cudaMemcpy3D(&p));
    }
    // Whole volume back into a padded host layout (row pitch w + 5 floats, 2 spare rows per slice).
    {
        const int hw = w + 5, hh = h + 2;
        std::vector<float> padded(size_t(hw) * hh * d, -1.0f);
        cudaMemcpy3DParms p = {};
        p.srcPtr = v2;
        p.dstPtr = make_cudaPitchedPtr(padded.data(), hw * sizeof(float), hw, hh);
        p.extent = ext;
        p.kind = cudaMemcpyDeviceToHost;
        CHECK(cudaMemcpy3D(&p));
        for (int z = 0; z < d; ++z)
            for (int y = 0; y < hh; ++y)
                for (int x = 0; x < hw; ++x) {
                    float got = padded[(size_t(z) * hh + y) * hw + x];
                    float want = (x < w && y < h) ? after3d(x, y, z) : -1.0f;
                    if (got != want)
                        fail("cudaMemcpy3D DtoH padded: (%d, %d, %d) = %g, expected %g", x, y, z, got, want);
                }
        printf("cudaMemcpy3D HtoD -> kernel -> DtoD -> DtoH (padded host layout): ok\n");
    }
    // A sub-box: x 10..59, y 3..12, z 2..6.
    {
        const int bw = 50, bh = 10, bd = 5;
        std::vector<float> box(size_t(bw) * bh * bd);
        cudaMemcpy3DParms p = {};
        p.srcPtr = v2;
        p.srcPos = make_cudaPos(10 * sizeof(float), 3, 2);
        p.dstPtr = make_cudaPitchedPtr(box.data(), bw * sizeof(float), bw, bh);
        p.extent = make_cudaExtent(bw * sizeof(float), bh, bd);
        p.kind = cudaMemcpyDeviceToHost;
        CHECK(cudaMemcpy3D(&p));
        for (int z = 0; z < bd; ++z)
            for (int y = 0; y < bh; ++y)
                for (int x = 0; x < bw; ++x)
                    EXPECT(box[(size_t(z) * bh + y) * bw + x] == after3d(x + 10, y + 3, z + 2),
                           "cudaMemcpy3D sub-box (%d, %d, %d)", x, y, z);
        printf("cudaMemcpy3D sub-box DtoH: ok\n");
    }
    // Host data into a sub-box of the device volume (dstPos), then the whole volume back.
    {
        const int bw = 7, bh = 3, bd = 2;
        std::vector<float> box(size_t(bw) * bh * bd);
        for (size_t i = 0; i < box.size(); ++i) box[i] = -static_cast<float>(i) - 0.5f;
        cudaMemcpy3DParms p = {};
        p.srcPtr = make_cudaPitchedPtr(box.data(), bw * sizeof(float), bw, bh);
        p.dstPtr = v2;
        p.dstPos = make_cudaPos(100 * sizeof(float), 14, 7);
        p.extent = make_cudaExtent(bw * sizeof(float), bh, bd);
        p.kind = cudaMemcpyHostToDevice;
        CHECK(cudaMemcpy3D(&p));
        std::vector<float> all(size_t(w) * h * d);
        cudaMemcpy3DParms q = {};
        q.srcPtr = v2;
        q.dstPtr = make_cudaPitchedPtr(all.data(), w * sizeof(float), w, h);
        q.extent = ext;
        q.kind = cudaMemcpyDeviceToHost;
        CHECK(cudaMemcpy3D(&q));
        for (int z = 0; z < d; ++z)
            for (int y = 0; y < h; ++y)
                for (int x = 0; x < w; ++x) {
                    float want = after3d(x, y, z);
                    if (x >= 100 && x < 107 && y >= 14 && y < 17 && z >= 7 && z < 9)
                        want = box[(size_t(z - 7) * bh + (y - 14)) * bw + (x - 100)];
                    float got = all[(size_t(z) * h + y) * w + x];
                    if (got != want)
                        fail("cudaMemcpy3D HtoD sub-box: (%d, %d, %d) = %g, expected %g", x, y, z, got, want);
                }
        printf("cudaMemcpy3D HtoD into a sub-box: ok (fnv %016llx)\n",
               static_cast<unsigned long long>(fnv1a(all.data(), all.size() * sizeof(float))));
    }

    CHECK(cudaFree(p1));
    CHECK(cudaFree(p2));
    CHECK(cudaFree(lin));
    CHECK(cudaFree(v1.ptr));
    CHECK(cudaFree(v2.ptr));
    return pass();
}
