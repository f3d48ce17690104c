// driver_memset: every memset width through the driver API (the runtime only exposes byte memsets):
// cuMemsetD8/D16/D32, cuMemsetD2D8/D2D16/D2D32 on pitched memory, and the async forms, each checked byte by
// byte after a copy back, with the bytes around each range untouched; plus the error for a misaligned
// 32-bit memset. Linked with -lcuda, no runtime.
#include <cuda.h>

#include <cstring>
#include <vector>

#include "common.cuh"
#include "cu_check.h"

static const char* err_name(CUresult r) {
    const char* n = "?";
    cuGetErrorName(r, &n);
    return n;
}

// Expected bytes of a buffer: a background byte, then ranges filled with a repeating element.
struct model {
    std::vector<unsigned char> bytes;
    model(size_t n, unsigned char bg) : bytes(n, bg) {}
    void fill(size_t off, const void* elem, size_t esize, size_t count) {
        for (size_t i = 0; i < count; ++i) memcpy(&bytes[off + i * esize], elem, esize);
    }
};

static void compare(const char* what, CUdeviceptr d, const model& m) {
    std::vector<unsigned char> h(m.bytes.size());
    CU_CHECK(cuMemcpyDtoH(h.data(), d, h.size()));
    for (size_t i = 0; i < h.size(); ++i)
        if (h[i] != m.bytes[i]) fail("%s: byte %zu = %#x, expected %#x", what, i, h[i], m.bytes[i]);
    printf("%s: ok (fnv %016llx)\n", what, static_cast<unsigned long long>(fnv1a(h.data(), h.size())));
}

int main() {
    CUcontext ctx;
    CUdevice dev = init_device0(&ctx);

    const size_t n = (4 << 20) + 64;
    CUdeviceptr d;
    CU_CHECK(cuMemAlloc(&d, n));
    model m(n, 0);
    CU_CHECK(cuMemsetD8(d, 0, n));

    // 1D, synchronous.
    const unsigned char v8 = 0xA5;
    const unsigned short v16 = 0xBEEF;
    const unsigned v32 = 0xDEADBEEF;
    CU_CHECK(cuMemsetD8(d + 1, v8, 12345));
    m.fill(1, &v8, 1, 12345);
    CU_CHECK(cuMemsetD16(d + 20000, v16, 3333));
    m.fill(20000, &v16, 2, 3333);
    CU_CHECK(cuMemsetD32(d + 40000, v32, 100001));
    m.fill(40000, &v32, 4, 100001);
    CU_CHECK(cuMemsetD32(d + n - 4 * 7, 0x01020304u, 7));
    const unsigned tail = 0x01020304u;
    m.fill(n - 4 * 7, &tail, 4, 7);
    compare("cuMemsetD8/D16/D32", d, m);

    // Misaligned addresses for the wide forms are errors, and change nothing.
    CUresult r16 = cuMemsetD16(d + 1, 0x1111, 4);
    CUresult r32 = cuMemsetD32(d + 2, 0x22222222u, 4);
    printf("cuMemsetD16 at an odd address: %s\n", err_name(r16));
    printf("cuMemsetD32 at a 2-aligned address: %s\n", err_name(r32));
    // Documented as errors; should a driver accept them, the model follows so that only the names differ.
    const unsigned short m16 = 0x1111;
    const unsigned m32 = 0x22222222u;
    if (r16 == CUDA_SUCCESS) m.fill(1, &m16, 2, 4);
    if (r32 == CUDA_SUCCESS) m.fill(2, &m32, 4, 4);
    compare("after the misaligned memsets", d, m);

    // 2D on pitched memory: width in elements, padding untouched.
    {
        CUdeviceptr p;
        size_t pitch = 0;
        const size_t wbytes = 1000, height = 33;
        CU_CHECK(cuMemAllocPitch(&p, &pitch, wbytes, height, 4));
        printf("cuMemAllocPitch(%zu, %zu, 4): pitch %zu\n", wbytes, height, pitch);
        model pm(pitch * height, 0xEE);
        CU_CHECK(cuMemsetD8(p, 0xEE, pitch * height));
        CU_CHECK(cuMemsetD2D8(p, pitch, 0x42, wbytes, height));
        for (size_t y = 0; y < height; ++y) pm.fill(y * pitch, "\x42", 1, wbytes);
        compare("cuMemsetD2D8", p, pm);
        CU_CHECK(cuMemsetD2D16(p + 2 * pitch + 10, pitch, 0x1234, 200, 7));
        const unsigned short e16 = 0x1234;
        for (size_t y = 2; y < 9; ++y) pm.fill(y * pitch + 10, &e16, 2, 200);
        compare("cuMemsetD2D16", p, pm);
        CU_CHECK(cuMemsetD2D32(p + 12 * pitch + 400, pitch, 0xCAFEF00Du, 100, 20));
        const unsigned e32 = 0xCAFEF00Du;
        for (size_t y = 12; y < 32; ++y) pm.fill(y * pitch + 400, &e32, 4, 100);
        compare("cuMemsetD2D32", p, pm);

        // async 2D
        CUstream s;
        CU_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        CU_CHECK(cuMemsetD2D8Async(p, pitch, 0x10, 16, height, s));
        CU_CHECK(cuMemsetD2D16Async(p + 16, pitch, 0x2020, 8, height, s));
        CU_CHECK(cuMemsetD2D32Async(p + 32, pitch, 0x30303030u, 4, height, s));
        CU_CHECK(cuStreamSynchronize(s));
        const unsigned char a8 = 0x10;
        const unsigned short a16 = 0x2020;
        const unsigned a32 = 0x30303030u;
        for (size_t y = 0; y < height; ++y) {
            pm.fill(y * pitch, &a8, 1, 16);
            pm.fill(y * pitch + 16, &a16, 2, 8);
            pm.fill(y * pitch + 32, &a32, 4, 4);
        }
        compare("cuMemsetD2D8/16/32Async", p, pm);
        CU_CHECK(cuStreamDestroy(s));
        CU_CHECK(cuMemFree(p));
    }

    // 1D async, in stream order, then a DtoH async in the same stream.
    {
        CUstream s;
        CU_CHECK(cuStreamCreate(&s, 0));
        CU_CHECK(cuMemsetD8Async(d, 0x77, n, s));
        CU_CHECK(cuMemsetD16Async(d + 64, 0x8899, 1000, s));
        CU_CHECK(cuMemsetD32Async(d + 1024, 0xAABBCCDDu, 500, s));
        std::vector<unsigned char> h(n);
        CU_CHECK(cuMemcpyDtoHAsync(h.data(), d, n, s));
        CU_CHECK(cuStreamSynchronize(s));
        model am(n, 0x77);
        const unsigned short b16 = 0x8899;
        const unsigned b32 = 0xAABBCCDDu;
        am.fill(64, &b16, 2, 1000);
        am.fill(1024, &b32, 4, 500);
        for (size_t i = 0; i < n; ++i)
            if (h[i] != am.bytes[i])
                fail("async memsets: byte %zu = %#x, expected %#x", i, h[i], am.bytes[i]);
        printf("cuMemsetD8/D16/D32Async then cuMemcpyDtoHAsync: ok\n");
        CU_CHECK(cuStreamDestroy(s));
    }

    CU_CHECK(cuMemFree(d));
    CU_CHECK(cuDevicePrimaryCtxRelease(dev));
    return pass();
}
