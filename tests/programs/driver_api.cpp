// driver_api: a program written against the driver API alone (linked with -lcuda, no runtime). It loads its
// own device code: an embedded fatbin with cuModuleLoadData and cuLibraryLoadData, an embedded PTX with
// cuModuleLoadData (JIT-compiled by the driver); finds functions, kernels and a global; reads parameter
// layouts; and launches with kernelParams, with the `extra` buffer form, with cuLaunchKernelEx, with a
// CUkernel cast to CUfunction (as cudart does), on the NULL stream and on a stream; with
// cuMemAlloc/cuMemAllocHost memory and sync and async copies.
#include <cuda.h>

#include <unistd.h>
#include <cstring>
#include <string>
#include <vector>

#include "common.cuh"
#include "cu_check.h"
#include "driver_api_fatbin.h"  // generated: driver_api_fatbin[] (nvcc -fatbin of driver_api_kernels.cu)
#include "driver_api_ptx.h"     // generated: driver_api_ptx[], NUL-terminated (nvcc -ptx)

static const char* err_name(CUresult r) {
    const char* n = "?";
    cuGetErrorName(r, &n);
    return n;
}

static void print_param_info(const char* what, CUfunction f) {
    printf("%s params:", what);
    for (size_t i = 0;; ++i) {
        size_t off = 0, size = 0;
        CUresult r = cuFuncGetParamInfo(f, i, &off, &size);
        if (r != CUDA_SUCCESS) {
            printf(" (index %zu: %s)\n", i, err_name(r));
            break;
        }
        printf(" [%zu] offset %zu size %zu;", i, off, size);
    }
}

static void print_kernel_param_info(const char* what, CUkernel k) {
    printf("%s params:", what);
    for (size_t i = 0;; ++i) {
        size_t off = 0, size = 0;
        CUresult r = cuKernelGetParamInfo(k, i, &off, &size);
        if (r != CUDA_SUCCESS) {
            printf(" (index %zu: %s)\n", i, err_name(r));
            break;
        }
        printf(" [%zu] offset %zu size %zu;", i, off, size);
    }
}

int main() {
    CU_CHECK(cuInit(0));
    int version = 0, count = 0;
    CU_CHECK(cuDriverGetVersion(&version));
    CU_CHECK(cuDeviceGetCount(&count));
    printf("driver version %d, %d device(s)\n", version, count);
    EXPECT(count > 0, "no device");
    CUdevice dev;
    CU_CHECK(cuDeviceGet(&dev, 0));
    char name[256];
    CU_CHECK(cuDeviceGetName(name, sizeof name, dev));
    size_t total = 0;
    CU_CHECK(cuDeviceTotalMem(&total, dev));
    int major = 0, minor = 0;
    CU_CHECK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    CU_CHECK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    printf("device 0: %s, %zu bytes, compute %d.%d\n", name, total, major, minor);

    CUcontext ctx = nullptr, cur = nullptr;
    CU_CHECK(cuCtxCreate(&ctx, nullptr, 0, dev));
    CU_CHECK(cuCtxGetCurrent(&cur));
    EXPECT(cur == ctx, "cuCtxGetCurrent is not the created context");
    CUdevice cdev = -1;
    CU_CHECK(cuCtxGetDevice(&cdev));
    printf("context created, current, on device %d\n", static_cast<int>(cdev));

    // The images, copied into 8-byte aligned buffers followed by unrelated bytes: the driver (and vcuda) must
    // size a fatbin by its header and PTX by its terminating NUL, not by the buffer.
    std::vector<unsigned long long> fatbin_buf(sizeof(driver_api_fatbin) / 8 + 64, 0xA5A5A5A5A5A5A5A5ull);
    memcpy(fatbin_buf.data(), driver_api_fatbin, sizeof(driver_api_fatbin));
    std::vector<unsigned long long> ptx_buf(sizeof(driver_api_ptx) / 8 + 64, 0x4141414141414141ull);
    memcpy(ptx_buf.data(), driver_api_ptx, sizeof(driver_api_ptx));
    printf("fatbin image %zu bytes, PTX %zu bytes\n", sizeof(driver_api_fatbin),
           strlen(reinterpret_cast<const char*>(driver_api_ptx)));

    CUmodule mod;
    CU_CHECK(cuModuleLoadData(&mod, fatbin_buf.data()));
    CUfunction f_scale, f_bias, f_iota;
    CU_CHECK(cuModuleGetFunction(&f_scale, mod, "drv_scale"));
    CU_CHECK(cuModuleGetFunction(&f_bias, mod, "drv_add_bias"));
    CU_CHECK(cuModuleGetFunction(&f_iota, mod, "drv_iota"));
    CUfunction missing;
    CUresult rm = cuModuleGetFunction(&missing, mod, "no_such_kernel");
    printf("cuModuleGetFunction(no_such_kernel): %s\n", err_name(rm));
    EXPECT(rm == CUDA_ERROR_NOT_FOUND, "looking up a missing kernel returned %s", err_name(rm));
    // Enumeration (cuFFT finds the function of each module it loads this way): the module's kernels by name.
    unsigned nfun = 0;
    CU_CHECK(cuModuleGetFunctionCount(&nfun, mod));
    std::vector<CUfunction> all(nfun);
    if (nfun) CU_CHECK(cuModuleEnumerateFunctions(all.data(), nfun, mod));
    int named = 0;
    for (CUfunction f : all) {
        const char* fname = nullptr;
        CU_CHECK(cuFuncGetName(&fname, f));
        for (const char* k : {"drv_scale", "drv_add_bias", "drv_iota"}) named += strcmp(fname, k) == 0;
    }
    printf("cuModuleEnumerateFunctions: the module's 3 kernels %s\n", named == 3 ? "listed" : "missing");
    printf("info: cuModuleGetFunctionCount %u\n", nfun);
    EXPECT(named == 3, "enumeration found %d of the module's 3 kernels", named);
    print_param_info("drv_scale", f_scale);
    print_param_info("drv_add_bias", f_bias);

    CUdeviceptr bias_ptr;
    size_t bias_size = 0;
    CU_CHECK(cuModuleGetGlobal(&bias_ptr, &bias_size, mod, "drv_bias"));
    printf("drv_bias: %zu bytes\n", bias_size);
    EXPECT(bias_size == sizeof(float), "drv_bias size %zu", bias_size);

    const int n = 100000;
    const size_t bytes = n * sizeof(float);
    std::vector<float> h(n), out(n);
    for (int i = 0; i < n; ++i) h[i] = static_cast<float>(i % 1000) - 500.0f;
    CUdeviceptr x;
    CU_CHECK(cuMemAlloc(&x, bytes));
    CU_CHECK(cuMemcpyHtoD(x, h.data(), bytes));
    const unsigned grid = (n + 255) / 256;

    // 1. kernelParams, NULL stream.
    float a = 3.0f;
    int nn = n;
    void* args[] = {&x, &a, &nn};
    CU_CHECK(cuLaunchKernel(f_scale, grid, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr));
    CU_CHECK(cuCtxSynchronize());
    CU_CHECK(cuMemcpyDtoH(out.data(), x, bytes));
    for (int i = 0; i < n; ++i) EXPECT(out[i] == h[i] * 3.0f, "kernelParams launch: [%d] = %g", i, out[i]);
    printf("cuLaunchKernel with kernelParams: ok\n");

    // 2. the `extra` form: one buffer laid out as the parameters are (pointer at 0, float at 8, int at 12).
    CUstream s;
    CU_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    {  // the stream's context, device, and (CUDA 12.5) green context: none
        CUcontext sc = nullptr, sc2 = nullptr;
        CUgreenCtx green = reinterpret_cast<CUgreenCtx>(1);
        CUdevice sd = -1;
        CU_CHECK(cuStreamGetCtx(s, &sc));
        CU_CHECK(cuStreamGetCtx_v2(s, &sc2, &green));
        CU_CHECK(cuStreamGetDevice(s, &sd));
        EXPECT(sc == ctx && sc2 == ctx && green == nullptr && sd == dev,
               "cuStreamGetCtx/_v2/GetDevice: %p %p %p %d", static_cast<void*>(sc), static_cast<void*>(sc2),
               static_cast<void*>(green), sd);
        printf("cuStreamGetCtx, cuStreamGetCtx_v2 (no green context), cuStreamGetDevice: ok\n");
    }
    {
        unsigned char buf[16];
        float a2 = -0.5f;
        memcpy(buf + 0, &x, 8);
        memcpy(buf + 8, &a2, 4);
        memcpy(buf + 12, &nn, 4);
        size_t size = sizeof buf;
        void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                         CU_LAUNCH_PARAM_END};
        CU_CHECK(cuLaunchKernel(f_scale, grid, 1, 1, 256, 1, 1, 0, s, nullptr, extra));
        CU_CHECK(cuStreamSynchronize(s));
        CU_CHECK(cuMemcpyDtoH(out.data(), x, bytes));
        for (int i = 0; i < n; ++i)
            EXPECT(out[i] == h[i] * 3.0f * -0.5f, "extra launch: [%d] = %g", i, out[i]);
        printf("cuLaunchKernel with extra: ok\n");
    }

    // 3. a global: read its initial value, set it, use it from a kernel through its address.
    {
        float init = 0;
        CU_CHECK(cuMemcpyDtoH(&init, bias_ptr, sizeof init));
        printf("drv_bias initial value: %g\n", init);
        float bias = 10.0f;
        CU_CHECK(cuMemcpyHtoD(bias_ptr, &bias, sizeof bias));
        void* bargs[] = {&x, &bias_ptr, &nn};
        CU_CHECK(cuLaunchKernel(f_bias, grid, 1, 1, 256, 1, 1, 0, s, bargs, nullptr));
        CU_CHECK(cuStreamSynchronize(s));
        CU_CHECK(cuMemcpyDtoH(out.data(), x, bytes));
        for (int i = 0; i < n; ++i)
            EXPECT(out[i] == h[i] * -1.5f + 10.0f, "bias launch: [%d] = %g", i, out[i]);
        printf("global set with cuMemcpyHtoD and used by a kernel: ok\n");
    }

    // 4. cuLaunchKernelEx.
    {
        CUlaunchConfig cfg = {};
        cfg.gridDimX = grid;
        cfg.gridDimY = cfg.gridDimZ = 1;
        cfg.blockDimX = 256;
        cfg.blockDimY = cfg.blockDimZ = 1;
        cfg.hStream = s;
        cfg.attrs = nullptr;
        cfg.numAttrs = 0;
        float a3 = 2.0f;
        void* eargs[] = {&x, &a3, &nn};
        CU_CHECK(cuLaunchKernelEx(&cfg, f_scale, eargs, nullptr));
        CU_CHECK(cuStreamSynchronize(s));
        CU_CHECK(cuMemcpyDtoH(out.data(), x, bytes));
        for (int i = 0; i < n; ++i)
            EXPECT(out[i] == (h[i] * -1.5f + 10.0f) * 2.0f, "cuLaunchKernelEx: [%d] = %g", i, out[i]);
        printf("cuLaunchKernelEx: ok\n");
    }

    // 5. PTX, JIT-compiled by the driver.
    CUmodule ptx_mod;
    CU_CHECK(cuModuleLoadData(&ptx_mod, ptx_buf.data()));
    CUfunction p_iota;
    CU_CHECK(cuModuleGetFunction(&p_iota, ptx_mod, "drv_iota"));
    print_param_info("drv_iota (PTX)", p_iota);
    CUdeviceptr iv;
    CU_CHECK(cuMemAlloc(&iv, n * sizeof(int)));
    {
        int base = 1000;
        void* iargs[] = {&iv, &base, &nn};
        CU_CHECK(cuLaunchKernel(p_iota, grid, 1, 1, 256, 1, 1, 0, nullptr, iargs, nullptr));
        std::vector<int> hi(n);
        CU_CHECK(cuMemcpyDtoH(hi.data(), iv, n * sizeof(int)));
        for (int i = 0; i < n; ++i) EXPECT(hi[i] == 1000 + i, "PTX drv_iota: [%d] = %d", i, hi[i]);
        printf("PTX module: ok\n");
    }

    // 5b. JIT options: log buffers and sizes, wall time; a bad PTX fails with its error log; the linker.
    {
        char info_log[4096], error_log[4096];
        CUjit_option o[] = {CU_JIT_INFO_LOG_BUFFER,  CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
                            CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
                            CU_JIT_LOG_VERBOSE,      CU_JIT_WALL_TIME};
        auto reset = [&](void** v) {
            info_log[0] = error_log[0] = 'X';
            v[0] = info_log;
            v[1] = reinterpret_cast<void*>(uintptr_t{sizeof info_log});
            v[2] = error_log;
            v[3] = reinterpret_cast<void*>(uintptr_t{sizeof error_log});
            v[4] = reinterpret_cast<void*>(uintptr_t{1});
            v[5] = nullptr;
        };
        void* v[6];
        reset(v);
        CUmodule jm;
        CU_CHECK(cuModuleLoadDataEx(&jm, ptx_buf.data(), 6, o, v));
        size_t info_len = reinterpret_cast<uintptr_t>(v[1]);
        EXPECT(info_len <= sizeof info_log && strlen(info_log) < sizeof info_log, "info log size %zu",
               info_len);
        EXPECT(info_log[0] != 'X', "the info log buffer was not written");
        float wall = 0;
        memcpy(&wall, &v[5], sizeof wall);
        printf("cuModuleLoadDataEx with log buffers: ok\n");
        printf("info: JIT info log %zu bytes (\"%.60s\"), wall time %g ms\n", info_len, info_log, wall);
        CUfunction jf;
        CU_CHECK(cuModuleGetFunction(&jf, jm, "drv_iota"));
        CU_CHECK(cuModuleUnload(jm));

        static const char bad_ptx[] = ".version 9.0\n.target sm_90\n.address_size 64\nthis is not PTX;\n";
        reset(v);
        CUmodule bad;
        CUresult rb = cuModuleLoadDataEx(&bad, bad_ptx, 6, o, v);
        printf("cuModuleLoadDataEx(bad PTX): %s, error log %s\n", err_name(rb),
               error_log[0] && error_log[0] != 'X' ? "written" : "empty");
        printf("info: JIT error log: %.100s\n", error_log);
        EXPECT(rb == CUDA_ERROR_INVALID_PTX, "bad PTX gave %s", err_name(rb));
        EXPECT(error_log[0] && error_log[0] != 'X', "no error log for bad PTX");

        CUjit_option unsupported = CU_JIT_GLOBAL_SYMBOL_NAMES;
        void* names = nullptr;
        CUresult ru = cuModuleLoadDataEx(&bad, ptx_buf.data(), 1, &unsupported, &names);
        printf("info: cuModuleLoadDataEx(CU_JIT_GLOBAL_SYMBOL_NAMES = NULL): %s\n", err_name(ru));

        reset(v);
        CUlinkState link;
        CU_CHECK(cuLinkCreate(6, o, v, &link));
        CU_CHECK(cuLinkAddData(link, CU_JIT_INPUT_PTX, ptx_buf.data(),
                               strlen(reinterpret_cast<const char*>(ptx_buf.data())) + 1, "driver_api.ptx", 0,
                               nullptr, nullptr));
        CUresult rl = cuLinkAddData(link, CU_JIT_INPUT_PTX, const_cast<char*>(bad_ptx), sizeof bad_ptx,
                                    "bad.ptx", 0, nullptr, nullptr);
        printf("cuLinkAddData(bad PTX): %s\n", err_name(rl));
        EXPECT(rl == CUDA_ERROR_INVALID_PTX, "linking bad PTX gave %s", err_name(rl));
        CU_CHECK(cuLinkDestroy(link));
        reset(v);
        CU_CHECK(cuLinkCreate(6, o, v, &link));
        CU_CHECK(cuLinkAddData(link, CU_JIT_INPUT_PTX, ptx_buf.data(),
                               strlen(reinterpret_cast<const char*>(ptx_buf.data())) + 1, "driver_api.ptx", 0,
                               nullptr, nullptr));
        void* cubin = nullptr;
        size_t cubin_size = 0;
        CU_CHECK(cuLinkComplete(link, &cubin, &cubin_size));
        EXPECT(cubin && cubin_size > 0, "cuLinkComplete gave no image");
        CUmodule lm;
        CU_CHECK(cuModuleLoadData(&lm, cubin));
        CU_CHECK(cuLinkDestroy(link));  // the image may go now: the module has it
        CUfunction l_iota;
        CU_CHECK(cuModuleGetFunction(&l_iota, lm, "drv_iota"));
        int base = 7;
        void* iargs[] = {&iv, &base, &nn};
        CU_CHECK(cuLaunchKernel(l_iota, grid, 1, 1, 256, 1, 1, 0, nullptr, iargs, nullptr));
        std::vector<int> hi(n);
        CU_CHECK(cuMemcpyDtoH(hi.data(), iv, n * sizeof(int)));
        for (int i = 0; i < n; ++i) EXPECT(hi[i] == 7 + i, "linked drv_iota: [%d] = %d", i, hi[i]);
        CU_CHECK(cuModuleUnload(lm));
        printf("linker: PTX linked, loaded and launched: ok\n");
        printf("info: linked image %zu bytes\n", cubin_size);
    }

    // 6. a library: kernel handle, its parameter layout, launch through cuKernelGetFunction and as a cast.
    {
        CUlibrary lib;
        CU_CHECK(cuLibraryLoadData(&lib, fatbin_buf.data(), nullptr, nullptr, 0, nullptr, nullptr, 0));
        CUkernel k;
        CU_CHECK(cuLibraryGetKernel(&k, lib, "drv_iota"));
        print_kernel_param_info("drv_iota (library)", k);
        CUfunction kf;
        CU_CHECK(cuKernelGetFunction(&kf, k));
        CUdeviceptr lg;
        size_t lg_size = 0;
        CU_CHECK(cuLibraryGetGlobal(&lg, &lg_size, lib, "drv_bias"));
        printf("library global drv_bias: %zu bytes\n", lg_size);

        int* pinned = nullptr;
        CU_CHECK(cuMemAllocHost(reinterpret_cast<void**>(&pinned), n * sizeof(int)));
        int base = -7;
        void* kargs[] = {&iv, &base, &nn};
        CU_CHECK(cuLaunchKernel(kf, grid, 1, 1, 256, 1, 1, 0, s, kargs, nullptr));
        CU_CHECK(cuMemcpyDtoHAsync(pinned, iv, n * sizeof(int), s));
        CU_CHECK(cuStreamSynchronize(s));
        for (int i = 0; i < n; ++i) EXPECT(pinned[i] == -7 + i, "library kernel: [%d] = %d", i, pinned[i]);
        base = 5;
        CU_CHECK(
            cuLaunchKernel(reinterpret_cast<CUfunction>(k), grid, 1, 1, 256, 1, 1, 0, s, kargs, nullptr));
        CU_CHECK(cuMemcpyDtoHAsync(pinned, iv, n * sizeof(int), s));
        CU_CHECK(cuStreamSynchronize(s));
        for (int i = 0; i < n; ++i)
            EXPECT(pinned[i] == 5 + i, "CUkernel as CUfunction: [%d] = %d", i, pinned[i]);
        printf("library kernel via cuKernelGetFunction and as a cast CUkernel: ok\n");
        CU_CHECK(cuMemFreeHost(pinned));
        CU_CHECK(cuLibraryUnload(lib));
    }

    // 7. async copy in, launch, async copy out on a stream; memory queries.
    {
        float* ph = nullptr;
        CU_CHECK(cuMemAllocHost(reinterpret_cast<void**>(&ph), bytes));
        for (int i = 0; i < n; ++i) ph[i] = static_cast<float>(i);
        CU_CHECK(cuMemcpyHtoDAsync(x, ph, bytes, s));
        float a4 = 0.25f;
        void* sargs[] = {&x, &a4, &nn};
        CU_CHECK(cuLaunchKernel(f_scale, grid, 1, 1, 256, 1, 1, 0, s, sargs, nullptr));
        CU_CHECK(cuMemcpyDtoHAsync(ph, x, bytes, s));
        CU_CHECK(cuStreamSynchronize(s));
        for (int i = 0; i < n; ++i)
            EXPECT(ph[i] == static_cast<float>(i) * 0.25f, "async round trip: [%d] = %g", i, ph[i]);
        printf("async HtoD, launch, DtoH on a stream: ok\n");
        // A context's events: recorded after the context's work, waited on by the context, then by the host.
        CUevent ce = nullptr;
        CU_CHECK(cuEventCreate(&ce, CU_EVENT_DISABLE_TIMING));
        CU_CHECK(cuMemcpyHtoDAsync(x, ph, bytes, s));
        float a5 = 2.0f;
        void* cargs[] = {&x, &a5, &nn};
        CU_CHECK(cuLaunchKernel(f_scale, grid, 1, 1, 256, 1, 1, 0, s, cargs, nullptr));
        CU_CHECK(cuCtxRecordEvent(ctx, ce));
        CU_CHECK(cuCtxWaitEvent(ctx, ce));
        CU_CHECK(cuEventSynchronize(ce));
        CU_CHECK(cuMemcpyDtoH(ph, x, bytes));
        for (int i = 0; i < n; ++i)
            EXPECT(ph[i] == static_cast<float>(i) * 0.5f, "after cuCtxRecordEvent: [%d] = %g", i, ph[i]);
        printf("cuCtxRecordEvent, cuCtxWaitEvent: ok; a NULL context: %s\n",
               err_name(cuCtxRecordEvent(nullptr, ce)));
        CU_CHECK(cuEventDestroy(ce));
        // A 1D array filled and read back with the async array copies, on the stream, from pinned memory.
        CUarray arr = nullptr;
        CUDA_ARRAY_DESCRIPTOR ad{};
        ad.Width = static_cast<size_t>(n);
        ad.Height = 0;
        ad.Format = CU_AD_FORMAT_FLOAT;
        ad.NumChannels = 1;
        CU_CHECK(cuArrayCreate(&arr, &ad));
        for (int i = 0; i < n; ++i) ph[i] = static_cast<float>(3 * i);
        CU_CHECK(cuMemcpyHtoAAsync(arr, 0, ph, bytes, s));
        CU_CHECK(cuStreamSynchronize(s));
        std::memset(ph, 0, bytes);
        CU_CHECK(cuMemcpyAtoHAsync(ph + 4, arr, 8 * sizeof(float), bytes - 8 * sizeof(float), s));
        CU_CHECK(cuStreamSynchronize(s));
        for (int i = 0; i < n - 8; ++i)
            EXPECT(ph[4 + i] == static_cast<float>(3 * (i + 8)), "array round trip: [%d] = %g", i, ph[4 + i]);
        EXPECT(ph[0] == 0.0f && ph[3] == 0.0f, "the array copy wrote before its destination");
        CU_CHECK(cuArrayDestroy(arr));
        printf("cuMemcpyHtoAAsync, cuMemcpyAtoHAsync (at an offset) on a stream: ok\n");
        CU_CHECK(cuMemFreeHost(ph));

        CUdeviceptr base = 0;
        size_t size = 0;
        CU_CHECK(cuMemGetAddressRange(&base, &size, x + 1000));
        printf("cuMemGetAddressRange(x + 1000): base == x: %s, size %zu\n", base == x ? "yes" : "no", size);
        EXPECT(base == x && size >= bytes, "cuMemGetAddressRange: size %zu", size);
        unsigned mtype = 0;
        CU_CHECK(cuPointerGetAttribute(&mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, x));
        printf("cuPointerGetAttribute(MEMORY_TYPE, x) = %s\n",
               mtype == CU_MEMORYTYPE_DEVICE ? "device" : "other");
        size_t free_b = 0, total_b = 0;
        CU_CHECK(cuMemGetInfo(&free_b, &total_b));
        printf("cuMemGetInfo total %zu\n", total_b);
        printf("info: cuMemGetInfo free %zu\n", free_b);
    }

    // 8. images named by file: a fatbin through cuModuleLoad, PTX through cuLibraryLoadFromFile (Triton's
    // launcher loads its cubins with cuModuleLoad); a missing file.
    {
        auto write_temp = [](const void* data, size_t size, const char* suffix) {
            char path[64];
            snprintf(path, sizeof path, "/tmp/driver_api_XXXXXX%s", suffix);
            int fd = mkstemps(path, static_cast<int>(strlen(suffix)));
            EXPECT(fd >= 0, "mkstemps failed");
            EXPECT(write(fd, data, size) == static_cast<ssize_t>(size), "writing %s failed", path);
            close(fd);
            return std::string(path);
        };
        std::string fatbin_path = write_temp(driver_api_fatbin, sizeof(driver_api_fatbin), ".fatbin");
        std::string ptx_path =
            write_temp(driver_api_ptx, strlen(reinterpret_cast<const char*>(driver_api_ptx)), ".ptx");
        CUmodule fmod;
        CU_CHECK(cuModuleLoad(&fmod, fatbin_path.c_str()));
        CUfunction f_file;
        CU_CHECK(cuModuleGetFunction(&f_file, fmod, "drv_iota"));
        CUlibrary flib;
        CU_CHECK(cuLibraryLoadFromFile(&flib, ptx_path.c_str(), nullptr, nullptr, 0, nullptr, nullptr, 0));
        CUkernel k_file;
        CU_CHECK(cuLibraryGetKernel(&k_file, flib, "drv_iota"));
        for (int round = 0; round < 2; ++round) {
            int base = 1000 * (round + 1);
            void* iargs[] = {&iv, &base, &nn};
            CUfunction which = round == 0 ? f_file : reinterpret_cast<CUfunction>(k_file);
            CU_CHECK(cuLaunchKernel(which, grid, 1, 1, 256, 1, 1, 0, nullptr, iargs, nullptr));
            std::vector<int> hi(n);
            CU_CHECK(cuMemcpyDtoH(hi.data(), iv, n * sizeof(int)));
            for (int i = 0; i < n; ++i)
                EXPECT(hi[i] == base + i, "image from a file, round %d: [%d] = %d", round, i, hi[i]);
        }
        printf("cuModuleLoad (fatbin file) and cuLibraryLoadFromFile (PTX file): drv_iota ok\n");
        CUmodule missing;
        printf("cuModuleLoad(a missing file) = %s\n",
               err_name(cuModuleLoad(&missing, "/nonexistent/vcuda.cubin")));
        CU_CHECK(cuLibraryUnload(flib));
        CU_CHECK(cuModuleUnload(fmod));
        unlink(fatbin_path.c_str());
        unlink(ptx_path.c_str());
    }

    CU_CHECK(cuStreamDestroy(s));
    CU_CHECK(cuMemFree(x));
    CU_CHECK(cuMemFree(iv));
    CU_CHECK(cuModuleUnload(ptx_mod));
    CU_CHECK(cuModuleUnload(mod));
    CU_CHECK(cuCtxDestroy(ctx));
    return pass();
}
