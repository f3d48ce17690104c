// suspend_resume: a program that stops calling for a while (argv[1] ms, default 0) between two phases, so
// that a server suspending idle sessions (vcuda-server --test-suspend-every, or the manager's
// --idle-suspend-after) saves its GPU state and rebuilds it at the second phase's first call. Natively, and
// through vcuda whether or not a suspend happened, it must print the same: memory contents at the same device
// addresses (small packed allocations and large ones), the stream's flags, priority, access policy window and
// synchronization policy, a function attribute
// it set, an event pair's elapsed time still measurable, an event without timing still complete, CUDA arrays
// (2D with padded rows, layered, mipmapped) with their contents, texture and surface objects at the values
// kernels hold, and new work on all of them; with argv[3] "user-object", a CUDA user object held through it;
// with "new-thread", a thread that makes its first call halfway through the pause.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common.cuh"

extern "C" __global__ void sr_fill(float* x, size_t n, float base) {
    size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
    if (i < n) x[i] = base + static_cast<float>(i % 1000);
}

extern "C" __global__ void sr_axpy(float* y, const float* x, size_t n, float a) {
    size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}

extern "C" __global__ void sr_surf_write(cudaSurfaceObject_t s, int w, int h, float base) {
    int x = threadIdx.x, y = threadIdx.y;
    if (x < w && y < h) surf2Dwrite(base + static_cast<float>(x + 100 * y), s, x * 4, y);
}

extern "C" __global__ void sr_tex_read(cudaTextureObject_t t, float* out, int w, int h) {
    int x = threadIdx.x, y = threadIdx.y;
    if (x < w && y < h) out[y * w + x] = tex2D<float>(t, x + 0.5f, y + 0.5f);
}

extern "C" __global__ void sr_tex1d(cudaTextureObject_t t, float* out, int n) {
    int i = threadIdx.x;
    if (i < n) out[i] = tex1Dfetch<float>(t, i);
}

// Texture and surface objects made before the pause, with one made and destroyed among them (the driver does
// not give its value again). Kernels hold their values, so after the pause the same values must still name
// them: reads through both textures and writes through the surface.
struct objects_kept {
    static constexpr int w = 16, h = 8;
    cudaArray_t arr = nullptr;
    float *lin = nullptr, *out = nullptr;
    cudaTextureObject_t tex = 0, tex_lin = 0;
    cudaSurfaceObject_t surf = 0;

    void make() {
        cudaChannelFormatDesc f = cudaCreateChannelDesc<float>();
        CHECK(cudaMallocArray(&arr, &f, w, h, cudaArraySurfaceLoadStore));
        CHECK(cudaMalloc(&lin, w * h * sizeof(float)));
        CHECK(cudaMalloc(&out, w * h * sizeof(float)));
        cudaResourceDesc ra{};
        ra.resType = cudaResourceTypeArray;
        ra.res.array.array = arr;
        cudaTextureDesc td{};
        td.filterMode = cudaFilterModePoint;
        td.readMode = cudaReadModeElementType;
        td.addressMode[0] = td.addressMode[1] = cudaAddressModeClamp;
        cudaTextureObject_t gone = 0;
        CHECK(cudaCreateTextureObject(&gone, &ra, &td, nullptr));
        CHECK(cudaCreateTextureObject(&tex, &ra, &td, nullptr));
        CHECK(cudaDestroyTextureObject(gone));
        CHECK(cudaCreateSurfaceObject(&surf, &ra));
        cudaResourceDesc rl{};
        rl.resType = cudaResourceTypeLinear;
        rl.res.linear.devPtr = lin;
        rl.res.linear.desc = f;
        rl.res.linear.sizeInBytes = w * h * sizeof(float);
        CHECK(cudaCreateTextureObject(&tex_lin, &rl, &td, nullptr));
        sr_fill<<<1, w * h>>>(lin, w * h, 100.0f);
        write(1.0f);
    }
    void write(float base) {
        sr_surf_write<<<1, dim3(w, h)>>>(surf, w, h, base);
        CHECK_LAUNCH();
        CHECK(cudaDeviceSynchronize());
    }
    void check(float base) {
        std::vector<float> v(w * h);
        sr_tex_read<<<1, dim3(w, h)>>>(tex, out, w, h);
        CHECK_LAUNCH();
        CHECK(cudaMemcpy(v.data(), out, v.size() * sizeof(float), cudaMemcpyDeviceToHost));
        for (int i = 0; i < w * h; ++i)
            EXPECT(v[i] == base + static_cast<float>(i % w + 100 * (i / w)), "texture read [%d] = %f", i,
                   v[i]);
        sr_tex1d<<<1, w * h>>>(tex_lin, out, w * h);
        CHECK_LAUNCH();
        CHECK(cudaMemcpy(v.data(), out, v.size() * sizeof(float), cudaMemcpyDeviceToHost));
        for (int i = 0; i < w * h; ++i)
            EXPECT(v[i] == 100.0f + static_cast<float>(i), "linear texture read [%d] = %f", i, v[i]);
    }
    void finish() {
        write(2.0f);
        check(2.0f);
        CHECK(cudaDestroyTextureObject(tex));
        CHECK(cudaDestroyTextureObject(tex_lin));
        CHECK(cudaDestroySurfaceObject(surf));
        CHECK(cudaFreeArray(arr));
        CHECK(cudaFree(lin));
        CHECK(cudaFree(out));
    }
};

// CUDA arrays made and filled before the pause; their contents are checked and written again after it.
struct arrays_kept {
    static constexpr size_t w = 37, h = 29;                // float2: 296-byte rows, which the driver pads
    static constexpr size_t lw = 20, lh = 10, layers = 3;  // uchar4, layered
    static constexpr size_t mw = 64, mh = 32, levels = 3;  // float, mipmapped
    cudaArray_t plain = nullptr, layered = nullptr;
    cudaMipmappedArray_t mip = nullptr;

    static float2 plain_at(size_t i, float base) {
        return {base + static_cast<float>(i), -static_cast<float>(i)};
    }
    static uchar4 layered_at(size_t i) {
        return {static_cast<unsigned char>(i), static_cast<unsigned char>(i >> 8), 7,
                static_cast<unsigned char>(i % 251)};
    }
    static float mip_at(size_t level, size_t i) { return static_cast<float>(level * 10000 + i); }

    void make() {
        cudaChannelFormatDesc f2 = cudaCreateChannelDesc<float2>();
        CHECK(cudaMallocArray(&plain, &f2, w, h));
        write_plain(1.0f);
        cudaChannelFormatDesc u4 = cudaCreateChannelDesc<uchar4>();
        CHECK(cudaMalloc3DArray(&layered, &u4, make_cudaExtent(lw, lh, layers), cudaArrayLayered));
        std::vector<uchar4> l(lw * lh * layers);
        for (size_t i = 0; i < l.size(); ++i) l[i] = layered_at(i);
        cudaMemcpy3DParms p{};
        p.srcPtr = make_cudaPitchedPtr(l.data(), lw * sizeof(uchar4), lw, lh);
        p.dstArray = layered;
        p.extent = make_cudaExtent(lw, lh, layers);
        p.kind = cudaMemcpyHostToDevice;
        CHECK(cudaMemcpy3D(&p));
        cudaChannelFormatDesc f1 = cudaCreateChannelDesc<float>();
        CHECK(cudaMallocMipmappedArray(&mip, &f1, make_cudaExtent(mw, mh, 0), levels));
        for (size_t lv = 0; lv < levels; ++lv) {
            cudaArray_t a;
            CHECK(cudaGetMipmappedArrayLevel(&a, mip, static_cast<unsigned>(lv)));
            const size_t cw = mw >> lv, ch = mh >> lv;
            std::vector<float> m(cw * ch);
            for (size_t i = 0; i < m.size(); ++i) m[i] = mip_at(lv, i);
            CHECK(cudaMemcpy2DToArray(a, 0, 0, m.data(), cw * sizeof(float), cw * sizeof(float), ch,
                                      cudaMemcpyHostToDevice));
        }
    }
    void write_plain(float base) {
        std::vector<float2> v(w * h);
        for (size_t i = 0; i < v.size(); ++i) v[i] = plain_at(i, base);
        CHECK(cudaMemcpy2DToArray(plain, 0, 0, v.data(), w * sizeof(float2), w * sizeof(float2), h,
                                  cudaMemcpyHostToDevice));
    }
    void check_plain(float base) {
        std::vector<float2> v(w * h);
        CHECK(cudaMemcpy2DFromArray(v.data(), w * sizeof(float2), plain, 0, 0, w * sizeof(float2), h,
                                    cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < v.size(); ++i)
            EXPECT(v[i].x == plain_at(i, base).x && v[i].y == plain_at(i, base).y,
                   "array element %zu is %f,%f", i, v[i].x, v[i].y);
    }
    // After the pause: the same contents; new writes land.
    void check() {
        check_plain(1.0f);
        std::vector<uchar4> l(lw * lh * layers);
        cudaMemcpy3DParms p{};
        p.srcArray = layered;
        p.dstPtr = make_cudaPitchedPtr(l.data(), lw * sizeof(uchar4), lw, lh);
        p.extent = make_cudaExtent(lw, lh, layers);
        p.kind = cudaMemcpyDeviceToHost;
        CHECK(cudaMemcpy3D(&p));
        for (size_t i = 0; i < l.size(); ++i) {
            uchar4 want = layered_at(i);
            EXPECT(l[i].x == want.x && l[i].y == want.y && l[i].z == want.z && l[i].w == want.w,
                   "layered array element %zu differs", i);
        }
        for (size_t lv = 0; lv < levels; ++lv) {
            cudaArray_t a;
            CHECK(cudaGetMipmappedArrayLevel(&a, mip, static_cast<unsigned>(lv)));
            const size_t cw = mw >> lv, ch = mh >> lv;
            std::vector<float> m(cw * ch);
            CHECK(cudaMemcpy2DFromArray(m.data(), cw * sizeof(float), a, 0, 0, cw * sizeof(float), ch,
                                        cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < m.size(); ++i)
                EXPECT(m[i] == mip_at(lv, i), "mipmap level %zu element %zu is %f", lv, i, m[i]);
        }
        write_plain(2.0f);
        check_plain(2.0f);
        CHECK(cudaFreeArray(plain));
        CHECK(cudaFreeArray(layered));
        CHECK(cudaFreeMipmappedArray(mip));
    }
};

// A CUDA user object the application holds through the pause (argv[3] "user-object"): still there after it,
// and its destructor runs once its last reference goes.
std::atomic<int> user_object_ends{0};
void CUDART_CB end_user_object(void* p) { static_cast<std::atomic<int>*>(p)->fetch_add(1); }

int main(int argc, char** argv) {
    const int idle_ms = argc > 1 ? atoi(argv[1]) : 0;
    const size_t ballast_floats = (argc > 2 ? strtoull(argv[2], nullptr, 10) : 0) << 18;  // MiB -> floats
    const std::string mode = argc > 3 ? argv[3] : "";
    const bool with_user_object = mode == "user-object";
    cudaUserObject_t user_object{};
    if (with_user_object)
        CHECK(cudaUserObjectCreate(&user_object, &user_object_ends, end_user_object, 1,
                                   cudaUserObjectNoDestructorSync));
    const size_t n = size_t{8} << 20;  // 32 MiB per buffer: mappings of their own
    const size_t small = 1000;         // 4 KB: packed with others in a shared mapping
    const unsigned grid = static_cast<unsigned>((n + 255) / 256);

    int least = 0, greatest = 0;
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
    cudaEvent_t start, stop, done;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CHECK(cudaFuncSetAttribute(sr_axpy, cudaFuncAttributeMaxDynamicSharedMemorySize, 2048));

    float *x, *y, *tiny;
    CHECK(cudaMalloc(&x, n * sizeof(float)));
    CHECK(cudaMalloc(&y, n * sizeof(float)));
    // Stream attributes the application set (cudaStreamSetAttribute): a window over y, a sync policy.
    cudaStreamAttrValue window{};
    window.accessPolicyWindow.base_ptr = y;
    window.accessPolicyWindow.num_bytes = 1 << 16;
    window.accessPolicyWindow.hitRatio = 0.5f;
    window.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
    window.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
    CHECK(cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &window));
    cudaStreamAttrValue policy{};
    policy.syncPolicy = cudaSyncPolicyYield;
    CHECK(cudaStreamSetAttribute(s, cudaStreamAttributeSynchronizationPolicy, &policy));
    CHECK(cudaMalloc(&tiny, small * sizeof(float)));
    std::vector<float> h(small);
    for (size_t i = 0; i < small; ++i) h[i] = static_cast<float>(i) * 0.25f;
    CHECK(cudaMemcpyAsync(tiny, h.data(), small * sizeof(float), cudaMemcpyHostToDevice, s));
    sr_fill<<<grid, 256, 0, s>>>(x, n, 1.0f);
    sr_fill<<<grid, 256, 0, s>>>(y, n, 2.0f);
    float* ballast = nullptr;
    if (ballast_floats) {
        CHECK(cudaMalloc(&ballast, ballast_floats * sizeof(float)));
        sr_fill<<<static_cast<unsigned>((ballast_floats + 255) / 256), 256, 0, s>>>(ballast, ballast_floats,
                                                                                    5.0f);
    }
    arrays_kept arrays;
    arrays.make();
    objects_kept objects;
    objects.make();
    objects.check(1.0f);
    CHECK(cudaEventRecord(start, s));
    sr_axpy<<<grid, 256, 0, s>>>(y, x, n, 0.5f);
    CHECK_LAUNCH();
    CHECK(cudaEventRecord(stop, s));
    CHECK(cudaEventRecord(done, s));
    CHECK(cudaEventSynchronize(stop));
    // A second thread that stays through the pause, as a framework's worker threads do (PyTorch's autograd
    // thread): idle while the session is suspended or moved, it calls again after.
    std::mutex mu;
    std::condition_variable cv;
    int worker_phase = 0;  // 1: run phase 1; 2: phase 2; guarded by mu
    int worker_done = 0;
    float* w_buf = nullptr;
    CHECK(cudaMalloc(&w_buf, 4096 * sizeof(float)));
    std::thread worker([&] {
        for (int phase = 1; phase <= 2; ++phase) {
            {
                std::unique_lock lock(mu);
                cv.wait(lock, [&] { return worker_phase >= phase; });
            }
            sr_fill<<<16, 256>>>(w_buf, 4096, static_cast<float>(10 * phase));
            CHECK(cudaDeviceSynchronize());
            float v = 0;
            CHECK(cudaMemcpy(&v, w_buf + 7, sizeof v, cudaMemcpyDeviceToHost));
            EXPECT(v == static_cast<float>(10 * phase + 7), "worker phase %d read %f", phase, v);
            std::lock_guard lock(mu);
            worker_done = phase;
            cv.notify_all();
        }
    });
    auto run_worker = [&](int phase) {
        std::unique_lock lock(mu);
        worker_phase = phase;
        cv.notify_all();
        cv.wait(lock, [&] { return worker_done >= phase; });
    };
    run_worker(1);
    printf("worker thread, phase 1: ok\n");
    float before = -1;
    CHECK(cudaEventElapsedTime(&before, start, stop));
    printf("phase 1 done\n");
    printf("info: phase 1 axpy %.3f ms; idle %d ms (device pointers %p %p %p)\n", before, idle_ms,
           static_cast<void*>(x), static_cast<void*>(y), static_cast<void*>(tiny));
    fflush(stdout);
    if (idle_ms > 0 && mode == "new-thread") {
        // A thread that first calls halfway through the pause: its connection joins the session while it
        // may be suspended or moved (or still being so).
        usleep(static_cast<useconds_t>(idle_ms / 2) * 1000);
        std::thread late([&] {
            sr_fill<<<16, 256>>>(w_buf, 4096, 90.0f);
            CHECK(cudaDeviceSynchronize());
            float v = 0;
            CHECK(cudaMemcpy(&v, w_buf + 7, sizeof v, cudaMemcpyDeviceToHost));
            EXPECT(v == 97.0f, "the thread new in the pause read %f", v);
        });
        late.join();
        printf("a thread new in the pause: ok\n");
        fflush(stdout);
        usleep(static_cast<useconds_t>(idle_ms - idle_ms / 2) * 1000);
    } else if (idle_ms > 0) {
        usleep(static_cast<useconds_t>(idle_ms) * 1000);
    }

    // Phase 2: everything made before the pause is still there, at the same addresses and handles.
    float after = -1;
    CHECK(cudaEventElapsedTime(&after, start, stop));
    EXPECT(after > 0.0f, "the events' elapsed time after the pause is %.6f ms", after);
    printf("elapsed time still measurable: yes\n");
    EXPECT(cudaEventQuery(done) == cudaSuccess, "the event without timing is no longer complete");
    printf("event without timing complete: yes\n");
    unsigned flags = 0;
    int priority = 0;
    CHECK(cudaStreamGetFlags(s, &flags));
    CHECK(cudaStreamGetPriority(s, &priority));
    EXPECT(flags == cudaStreamNonBlocking && priority == greatest, "stream flags %u priority %d", flags,
           priority);
    printf("stream flags and priority kept: yes\n");
    cudaStreamAttrValue got{};
    CHECK(cudaStreamGetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &got));
    EXPECT(got.accessPolicyWindow.base_ptr == y && got.accessPolicyWindow.num_bytes == (1 << 16) &&
               got.accessPolicyWindow.hitProp == cudaAccessPropertyPersisting &&
               got.accessPolicyWindow.missProp == cudaAccessPropertyStreaming,
           "the stream's access policy window is now %zu bytes, hit %d, miss %d",
           got.accessPolicyWindow.num_bytes, int(got.accessPolicyWindow.hitProp),
           int(got.accessPolicyWindow.missProp));
    got = {};
    CHECK(cudaStreamGetAttribute(s, cudaStreamAttributeSynchronizationPolicy, &got));
    EXPECT(got.syncPolicy == cudaSyncPolicyYield, "the stream's synchronization policy is now %d",
           int(got.syncPolicy));
    printf("stream access policy window and synchronization policy kept: yes\n");
    cudaFuncAttributes fa{};
    CHECK(cudaFuncGetAttributes(&fa, sr_axpy));
    EXPECT(fa.maxDynamicSharedSizeBytes == 2048, "max dynamic shared memory %d",
           fa.maxDynamicSharedSizeBytes);
    printf("function attribute kept: yes\n");
    arrays.check();
    printf("CUDA arrays kept: yes\n");
    objects.check(1.0f);
    objects.finish();
    printf("texture and surface objects kept: yes\n");
    if (with_user_object) {
        CHECK(cudaUserObjectRetain(user_object, 1));
        CHECK(cudaUserObjectRelease(user_object, 1));
        EXPECT(user_object_ends.load() == 0, "the user object's destructor ran while it was held");
        CHECK(cudaUserObjectRelease(user_object, 1));
        for (int i = 0; i < 200 && user_object_ends.load() == 0; ++i) usleep(10000);
        EXPECT(user_object_ends.load() == 1, "the user object's destructor ran %d times, not once",
               user_object_ends.load());
        printf("user object kept, its destructor run at its last release: yes\n");
    }

    float* z;  // a new allocation after the pause
    CHECK(cudaMalloc(&z, n * sizeof(float)));
    sr_fill<<<grid, 256, 0, s>>>(z, n, 3.0f);
    sr_axpy<<<grid, 256, 0, s>>>(y, z, n, 0.25f);
    CHECK_LAUNCH();
    std::vector<float> hy(n), ht(small);
    CHECK(cudaMemcpyAsync(hy.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost, s));
    CHECK(cudaMemcpyAsync(ht.data(), tiny, small * sizeof(float), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));
    for (size_t i = 0; i < n; ++i) {
        float xi = 1.0f + static_cast<float>(i % 1000), zi = 3.0f + static_cast<float>(i % 1000);
        float want = (2.0f + static_cast<float>(i % 1000)) + 0.5f * xi;
        want += 0.25f * zi;
        if (hy[i] != want) fail("y[%zu] = %f, expected %f", i, hy[i], want);
    }
    for (size_t i = 0; i < small; ++i)
        if (ht[i] != h[i]) fail("tiny[%zu] = %f, expected %f", i, ht[i], h[i]);
    printf("memory contents: ok\n");
    run_worker(2);
    worker.join();
    printf("worker thread, phase 2: ok\n");
    CHECK(cudaFree(w_buf));
    if (ballast) {  // checked in pieces of 64 MiB
        std::vector<float> piece(size_t{16} << 20);
        for (size_t off = 0; off < ballast_floats; off += piece.size()) {
            size_t k = std::min(piece.size(), ballast_floats - off);
            CHECK(cudaMemcpy(piece.data(), ballast + off, k * sizeof(float), cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < k; ++i)
                if (piece[i] != 5.0f + static_cast<float>((off + i) % 1000))
                    fail("ballast[%zu] = %f", off + i, piece[i]);
        }
        printf("extra memory contents: ok\n");
        CHECK(cudaFree(ballast));
    }
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    CHECK(cudaFree(z));
    CHECK(cudaFree(tiny));
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    CHECK(cudaEventDestroy(done));
    CHECK(cudaStreamDestroy(s));
    return pass();
}
