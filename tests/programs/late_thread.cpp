// late_thread: kernels looked up and launched by threads started after the library was loaded, the lookup
// made before the thread has a context (context-free in CUDA: cuLibraryGetKernel), then the launch with the
// context made current. Through vcuda such a thread is a new lane whose first call names no device: the
// kernel's parameter layout must still be the real one (it once came back empty, and the launch crashed the
// server).
#include <cuda.h>

#include <thread>
#include <vector>

#include "common.cuh"
#include "cu_check.h"
#include "driver_api_fatbin.h"  // generated: driver_api_fatbin[] (nvcc -fatbin of driver_api_kernels.cu)

int main() {
    CUcontext ctx;
    CUdevice dev = init_device0(&ctx);
    CUlibrary lib;
    CU_CHECK(cuLibraryLoadData(&lib, driver_api_fatbin, nullptr, nullptr, 0, nullptr, nullptr, 0));

    const int n = 100003;
    CUdeviceptr x = 0, y = 0;
    CU_CHECK(cuMemAlloc(&x, n * sizeof(float)));
    CU_CHECK(cuMemAlloc(&y, n * sizeof(int)));
    std::vector<float> host(n);
    for (int i = 0; i < n; ++i) host[i] = static_cast<float>(i % 1000) - 500.0f;
    CU_CHECK(cuMemcpyHtoD(x, host.data(), n * sizeof(float)));

    // Thread 1: no context when it looks drv_scale up; launches it (CUkernel cast to CUfunction, as cudart
    // does).
    std::thread([&] {
        CUcontext none = reinterpret_cast<CUcontext>(1);
        CU_CHECK(cuCtxGetCurrent(&none));
        EXPECT(none == nullptr, "a new thread has no current context");
        CUkernel k;
        CU_CHECK(cuLibraryGetKernel(&k, lib, "drv_scale"));
        CU_CHECK(cuCtxSetCurrent(ctx));
        float a = -2.5f;
        int count = n;
        void* params[] = {&x, &a, &count};
        CU_CHECK(cuLaunchKernel(reinterpret_cast<CUfunction>(k), (n + 255) / 256, 1, 1, 256, 1, 1, 0, nullptr,
                                params, nullptr));
        CU_CHECK(cuCtxSynchronize());
    }).join();

    // Thread 2: the same for drv_iota, launched with the `extra` buffer form on a stream of its own.
    std::thread([&] {
        CUkernel k;
        CU_CHECK(cuLibraryGetKernel(&k, lib, "drv_iota"));
        CU_CHECK(cuCtxSetCurrent(ctx));
        CUstream s;
        CU_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        struct {
            CUdeviceptr out;
            int base;
            int n;
        } packed{y, 7, n};
        size_t size = sizeof packed;
        void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                         CU_LAUNCH_PARAM_END};
        CU_CHECK(cuLaunchKernel(reinterpret_cast<CUfunction>(k), (n + 127) / 128, 1, 1, 128, 1, 1, 0, s,
                                nullptr, extra));
        CU_CHECK(cuStreamSynchronize(s));
        CU_CHECK(cuStreamDestroy(s));
    }).join();

    std::vector<float> scaled(n);
    std::vector<int> iota(n);
    CU_CHECK(cuMemcpyDtoH(scaled.data(), x, n * sizeof(float)));
    CU_CHECK(cuMemcpyDtoH(iota.data(), y, n * sizeof(int)));
    double sum = 0;
    for (int i = 0; i < n; ++i) {
        if (scaled[i] != host[i] * -2.5f) fail("x[%d] = %.9g, expected %.9g", i, scaled[i], host[i] * -2.5f);
        if (iota[i] != 7 + i) fail("y[%d] = %d, expected %d", i, iota[i], 7 + i);
        sum += scaled[i];
    }
    printf("n = %d, sum of scaled = %.3f, y[n-1] = %d\n", n, sum, iota[n - 1]);
    CU_CHECK(cuMemFree(x));
    CU_CHECK(cuMemFree(y));
    CU_CHECK(cuLibraryUnload(lib));
    CU_CHECK(cuDevicePrimaryCtxRelease(dev));
    return pass();
}
