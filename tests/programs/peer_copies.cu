// peer_copies: peer copies and peer access as the CUDA sample p2pBandwidthLatencyTest uses them, on one
// device or several — cudaMemcpyPeer and cudaMemcpyPeerAsync (on one device: a device-to-device copy), a 3D
// peer copy of a sub-box; for every pair of devices: cudaDeviceCanAccessPeer, and where it answers yes, peer
// access enabled (twice: the second refused), a kernel on one device writing the other's memory, access
// disabled (twice: the second refused); peer copies both ways between every pair. Every byte is checked on
// the host. `peer_copies refusal-ok`: a peer copy between devices that are not peers may answer
// cudaErrorPeerAccessUnsupported (vcuda, devices of two different servers); it is printed, not a failure.
#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "common.cuh"

extern "C" __global__ void pc_copy(int* dst, const int* src, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        dst[i] = src[i] + 1;
}

static bool refusal_ok = false;

static void fill(std::vector<int>& h, int seed) {
    rng r(seed);
    for (auto& v : h) v = static_cast<int>(r.u32() & 0xffffff);
}

static void expect_equal(const std::vector<int>& got, const std::vector<int>& want, int add,
                         const char* what) {
    for (size_t i = 0; i < want.size(); ++i)
        EXPECT(got[i] == want[i] + add, "%s: element %zu = %d, expected %d", what, i, got[i], want[i] + add);
}

// cudaMemcpyPeer(Async) between two allocations of device `d`, and a 3D peer copy of a sub-box.
static void same_device(int d) {
    const int n = 1 << 18;
    CHECK(cudaSetDevice(d));
    std::vector<int> h(n), back(n);
    fill(h, 11 + d);
    int *a = nullptr, *b = nullptr;
    CHECK(cudaMalloc(&a, n * sizeof(int)));
    CHECK(cudaMalloc(&b, n * sizeof(int)));
    CHECK(cudaMemcpy(a, h.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpyPeer(b, d, a, d, n * sizeof(int)));
    CHECK(cudaMemcpy(back.data(), b, n * sizeof(int), cudaMemcpyDeviceToHost));
    expect_equal(back, h, 0, "cudaMemcpyPeer on one device");
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaMemsetAsync(b, 0, n * sizeof(int), s));
    CHECK(cudaMemcpyPeerAsync(b, d, a, d, n * sizeof(int) / 2, s));
    CHECK(cudaMemcpyAsync(back.data(), b, n * sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; ++i)
        EXPECT(back[i] == (i < n / 2 ? h[i] : 0), "cudaMemcpyPeerAsync on one device: element %d = %d", i,
               back[i]);
    printf("device %d: cudaMemcpyPeer and cudaMemcpyPeerAsync on one device: ok\n", d);

    // 3D: a 20 x 6 x 3 box of ints from (4, 2, 1) of a 64 x 16 x 4 volume to (0, 0, 0) of another.
    const int W = 64, H = 16, D = 4;
    cudaPitchedPtr src{}, dst{};
    CHECK(cudaMalloc3D(&src, make_cudaExtent(W * sizeof(int), H, D)));
    CHECK(cudaMalloc3D(&dst, make_cudaExtent(W * sizeof(int), H, D)));
    std::vector<int> vol(size_t(W) * H * D);
    fill(vol, 99 + d);
    cudaMemcpy3DParms up{};
    up.srcPtr = make_cudaPitchedPtr(vol.data(), W * sizeof(int), W, H);
    up.dstPtr = src;
    up.extent = make_cudaExtent(W * sizeof(int), H, D);
    up.kind = cudaMemcpyHostToDevice;
    CHECK(cudaMemcpy3D(&up));
    CHECK(cudaMemset3D(dst, 0, make_cudaExtent(W * sizeof(int), H, D)));
    cudaMemcpy3DPeerParms p{};
    p.srcPtr = src;
    p.srcPos = make_cudaPos(4 * sizeof(int), 2, 1);
    p.srcDevice = d;
    p.dstPtr = dst;
    p.dstDevice = d;
    p.extent = make_cudaExtent(20 * sizeof(int), 6, 3);
    CHECK(cudaMemcpy3DPeer(&p));
    std::vector<int> out(vol.size());
    cudaMemcpy3DParms down{};
    down.srcPtr = dst;
    down.dstPtr = make_cudaPitchedPtr(out.data(), W * sizeof(int), W, H);
    down.extent = make_cudaExtent(W * sizeof(int), H, D);
    down.kind = cudaMemcpyDeviceToHost;
    CHECK(cudaMemcpy3D(&down));
    for (int z = 0; z < D; ++z)
        for (int y = 0; y < H; ++y)
            for (int x = 0; x < W; ++x) {
                bool in = x < 20 && y < 6 && z < 3;
                int want = in ? vol[(size_t(z + 1) * H + (y + 2)) * W + (x + 4)] : 0;
                EXPECT(out[(size_t(z) * H + y) * W + x] == want, "cudaMemcpy3DPeer: (%d, %d, %d)", x, y, z);
            }
    printf("device %d: cudaMemcpy3DPeer of a sub-box: ok\n", d);
    CHECK(cudaFree(src.ptr));
    CHECK(cudaFree(dst.ptr));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
}

// Devices i and j: peer access where the driver offers it, and peer copies both ways.
static void pair(int i, int j) {
    const int n = 1 << 18;
    std::vector<int> h(n), back(n);
    fill(h, 1000 + i * 10 + j);
    int *a = nullptr, *b = nullptr, *c = nullptr;
    CHECK(cudaSetDevice(i));
    CHECK(cudaMalloc(&a, n * sizeof(int)));
    CHECK(cudaMalloc(&c, n * sizeof(int)));
    CHECK(cudaMemcpy(a, h.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaSetDevice(j));
    CHECK(cudaMalloc(&b, n * sizeof(int)));
    CHECK(cudaMemset(b, 0, n * sizeof(int)));

    int can = 0;
    CHECK(cudaDeviceCanAccessPeer(&can, i, j));
    if (can) {
        CHECK(cudaSetDevice(i));
        CHECK(cudaDeviceEnablePeerAccess(j, 0));
        cudaError_t e = cudaDeviceEnablePeerAccess(j, 0);
        EXPECT(e == cudaErrorPeerAccessAlreadyEnabled, "enabling twice: %s", cudaGetErrorName(e));
        cudaGetLastError();
        pc_copy<<<64, 256>>>(b, a, n);  // device i writes device j's memory
        CHECK_LAUNCH();
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaSetDevice(j));
        CHECK(cudaMemcpy(back.data(), b, n * sizeof(int), cudaMemcpyDeviceToHost));
        expect_equal(back, h, 1, "a kernel writing a peer's memory");
        CHECK(cudaSetDevice(i));
        CHECK(cudaDeviceDisablePeerAccess(j));
        e = cudaDeviceDisablePeerAccess(j);
        EXPECT(e == cudaErrorPeerAccessNotEnabled, "disabling twice: %s", cudaGetErrorName(e));
        cudaGetLastError();
        printf("devices %d -> %d: peer access enabled, a kernel wrote the peer's memory, disabled: ok\n", i,
               j);
    }

    CHECK(cudaSetDevice(i));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaError_t e = cudaMemcpyPeerAsync(b, j, a, i, n * sizeof(int), s);
    if (e == cudaErrorPeerAccessUnsupported && refusal_ok && !can) {
        cudaGetLastError();
        printf("devices %d -> %d: peer copy refused: %s\n", i, j, cudaGetErrorName(e));
        CHECK(cudaStreamDestroy(s));
    } else {
        CHECK(e);
        CHECK(cudaStreamSynchronize(s));
        CHECK(cudaSetDevice(j));
        CHECK(cudaMemcpy(back.data(), b, n * sizeof(int), cudaMemcpyDeviceToHost));
        expect_equal(back, h, 0, "cudaMemcpyPeerAsync between devices");
        CHECK(cudaMemcpyPeer(c, i, b, j, n * sizeof(int)));
        CHECK(cudaSetDevice(i));
        CHECK(cudaMemcpy(back.data(), c, n * sizeof(int), cudaMemcpyDeviceToHost));
        expect_equal(back, h, 0, "cudaMemcpyPeer back");
        CHECK(cudaStreamDestroy(s));
        printf("devices %d <-> %d: peer copies both ways: ok\n", i, j);
    }
    CHECK(cudaFree(a));
    CHECK(cudaFree(c));
    CHECK(cudaSetDevice(j));
    CHECK(cudaFree(b));
}

int main(int argc, char** argv) {
    refusal_ok = argc > 1 && std::strcmp(argv[1], "refusal-ok") == 0;
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    printf("devices: %d\n", count);
    for (int d = 0; d < count; ++d) same_device(d);
    for (int i = 0; i < count; ++i)
        for (int j = 0; j < count; ++j) {
            if (i == j) continue;
            int can = -1;
            CHECK(cudaDeviceCanAccessPeer(&can, i, j));
            printf("device %d %s access device %d\n", i, can ? "CAN" : "CANNOT", j);
        }
    CHECK(cudaSetDevice(0));
    cudaError_t e = cudaDeviceEnablePeerAccess(0, 0);
    EXPECT(e != cudaSuccess, "peer access of a device to itself was enabled");
    cudaGetLastError();
    printf("peer access to the current device itself: %s\n", cudaGetErrorName(e));
    for (int i = 0; i < count; ++i)
        for (int j = 0; j < count; ++j)
            if (i != j) pair(i, j);
    return pass();
}
