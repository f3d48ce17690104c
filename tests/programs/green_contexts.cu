// green_contexts: an SM partition made as torch.cuda.green_contexts makes one (PyTorch's CUDAGreenContext):
// the device's SM resource split by count, a descriptor of one group, a green context and its CUcontext
// pushed current. Under it, a stream of cudaStreamCreate, the green context's default stream and a stream of
// cuGreenCtxStreamCreate each run a kernel on one buffer, in order through an event; the partition's SM count
// is read back from the context and from the green context. Popped, a stream of the primary context waits for
// the green context's event and runs the last kernel; the buffer is checked, the green context destroyed, and
// the primary context still works. Driver entry points come through cudaGetDriverEntryPointByVersion, as
// PyTorch's do. `green_contexts PAUSE_MS`: a pause while the green context is current, in which a server may
// try to suspend or move the session (it must refuse, and the program go on).
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdlib>

#include <vector>

#include "common.cuh"

extern "C" __global__ void gc_fill(int* p, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}

extern "C" __global__ void gc_add(int* p, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += v;
}

// Each block writes the SM it ran on: a green context's blocks run on its partition only.
extern "C" __global__ void gc_sm(int* out) {
    if (threadIdx.x != 0) return;
    unsigned sm = 0;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    out[blockIdx.x] = static_cast<int>(sm);
}

namespace {

// How many SMs `blocks` blocks of gc_sm ran on, launched on `s` of the current context.
int sms_used(int* out, int blocks, cudaStream_t s) {
    gc_sm<<<blocks, 128, 0, s>>>(out);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(s));
    std::vector<int> ids(blocks);
    CHECK(cudaMemcpy(ids.data(), out, blocks * sizeof(int), cudaMemcpyDeviceToHost));
    std::vector<bool> seen(1024);
    int n = 0;
    for (int id : ids)
        if (id >= 0 && id < 1024 && !seen[id]) {
            seen[id] = true;
            ++n;
        }
    return n;
}

void* driver_entry(const char* name) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CHECK(cudaGetDriverEntryPointByVersion(name, &fn, 13000, cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || !fn)
        fail("%s: no driver entry point (%d)", name, static_cast<int>(q));
    return fn;
}

void check_cu(CUresult rc, const char* what) {
    if (rc != CUDA_SUCCESS) fail("%s: CUresult %d", what, static_cast<int>(rc));
}

template <class F>
F entry(const char* name) {
    return reinterpret_cast<F>(driver_entry(name));
}

}  // namespace

int main(int argc, char** argv) {
    const int n = 1 << 16;
    const int pause_ms = argc > 1 ? atoi(argv[1]) : 0;
    if (pause_ms < 0) fail("usage: green_contexts [PAUSE_MS]");
    CHECK(cudaFree(nullptr));  // the primary context, current
    auto get_dev_resource = entry<decltype(&cuDeviceGetDevResource)>("cuDeviceGetDevResource");
    auto split = entry<decltype(&cuDevSmResourceSplitByCount)>("cuDevSmResourceSplitByCount");
    auto make_desc = entry<decltype(&cuDevResourceGenerateDesc)>("cuDevResourceGenerateDesc");
    auto green_create = entry<decltype(&cuGreenCtxCreate)>("cuGreenCtxCreate");
    auto from_green = entry<decltype(&cuCtxFromGreenCtx)>("cuCtxFromGreenCtx");
    auto green_destroy = entry<decltype(&cuGreenCtxDestroy)>("cuGreenCtxDestroy");
    auto ctx_resource = entry<decltype(&cuCtxGetDevResource)>("cuCtxGetDevResource");
    auto green_resource = entry<decltype(&cuGreenCtxGetDevResource)>("cuGreenCtxGetDevResource");
    auto green_stream = entry<decltype(&cuGreenCtxStreamCreate)>("cuGreenCtxStreamCreate");
    auto push = entry<decltype(&cuCtxPushCurrent_v2)>("cuCtxPushCurrent");
    auto pop = entry<decltype(&cuCtxPopCurrent_v2)>("cuCtxPopCurrent");
    auto get_current = entry<decltype(&cuCtxGetCurrent)>("cuCtxGetCurrent");
    auto green_record = entry<decltype(&cuGreenCtxRecordEvent)>("cuGreenCtxRecordEvent");
    auto green_wait = entry<decltype(&cuGreenCtxWaitEvent)>("cuGreenCtxWaitEvent");
    auto green_id = entry<decltype(&cuGreenCtxGetId)>("cuGreenCtxGetId");
    auto stream_green = entry<decltype(&cuStreamGetGreenCtx)>("cuStreamGetGreenCtx");
    auto stream_ctx = entry<decltype(&cuStreamGetCtx_v2)>("cuStreamGetCtx");

    CUdevice dev = 0;
    CUdevResource all{};
    check_cu(get_dev_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource");
    printf("device SMs %u, smallest partition %u\n", all.sm.smCount, all.sm.minSmPartitionSize);
    unsigned groups = 0;
    check_cu(split(nullptr, &groups, &all, nullptr, 0, 16), "cuDevSmResourceSplitByCount (count)");
    printf("groups of at least 16 SMs: %u\n", groups);
    EXPECT(groups >= 1, "no group of 16 SMs");
    CUdevResource part{}, rest{};
    unsigned one = 1;
    check_cu(split(&part, &one, &all, &rest, 0, 16), "cuDevSmResourceSplitByCount");
    printf("one group: %u SMs, %u remaining\n", part.sm.smCount, rest.sm.smCount);
    EXPECT(one == 1 && part.sm.smCount >= 16 && part.sm.smCount + rest.sm.smCount == all.sm.smCount,
           "split: %u group(s) of %u SMs, %u remaining, of %u", one, part.sm.smCount, rest.sm.smCount,
           all.sm.smCount);

    CUdevResourceDesc desc = nullptr;
    check_cu(make_desc(&desc, &part, 1), "cuDevResourceGenerateDesc");
    CUgreenCtx green = nullptr;
    check_cu(green_create(&green, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate");
    CUcontext gctx = nullptr, again = nullptr, primary = nullptr, current = nullptr;
    check_cu(from_green(&gctx, green), "cuCtxFromGreenCtx");
    check_cu(from_green(&again, green), "cuCtxFromGreenCtx (again)");
    EXPECT(gctx != nullptr && gctx == again, "cuCtxFromGreenCtx gave %p then %p", static_cast<void*>(gctx),
           static_cast<void*>(again));
    check_cu(get_current(&primary), "cuCtxGetCurrent");
    EXPECT(primary != gctx, "the green context is current before it was pushed");
    CUdevResource r{};
    check_cu(green_resource(green, &r, CU_DEV_RESOURCE_TYPE_SM), "cuGreenCtxGetDevResource");
    EXPECT(r.sm.smCount == part.sm.smCount, "the green context has %u SMs, its group %u", r.sm.smCount,
           part.sm.smCount);
    check_cu(ctx_resource(gctx, &r, CU_DEV_RESOURCE_TYPE_SM), "cuCtxGetDevResource (green)");
    EXPECT(r.sm.smCount == part.sm.smCount, "its context has %u SMs", r.sm.smCount);
    check_cu(ctx_resource(primary, &r, CU_DEV_RESOURCE_TYPE_SM), "cuCtxGetDevResource (primary)");
    EXPECT(r.sm.smCount == all.sm.smCount, "the primary context has %u SMs of %u", r.sm.smCount,
           all.sm.smCount);

    int* buf = nullptr;
    CHECK(cudaMalloc(&buf, n * sizeof(int)));
    const int blocks = (n + 255) / 256;
    int* sm_ids = nullptr;
    const int sm_blocks = 4096;
    CHECK(cudaMalloc(&sm_ids, sm_blocks * sizeof(int)));
    const int primary_sms = sms_used(sm_ids, sm_blocks, nullptr);
    printf("blocks of the primary context ran on more SMs than the partition has: %s\n",
           primary_sms > static_cast<int>(part.sm.smCount) ? "yes" : "no");

    check_cu(push(gctx), "cuCtxPushCurrent (green)");
    check_cu(get_current(&current), "cuCtxGetCurrent");
    EXPECT(current == gctx, "the pushed green context is not current");
    cudaStream_t s1 = nullptr, s2 = nullptr;
    CHECK(cudaStreamCreate(&s1));
    if (pause_ms > 0) usleep(static_cast<useconds_t>(pause_ms) * 1000);
    const int green_sms = sms_used(sm_ids, sm_blocks, s1);
    printf("info: %d SMs ran the primary context's blocks, %d the green context's\n", primary_sms, green_sms);
    EXPECT(green_sms >= 1 && green_sms <= static_cast<int>(part.sm.smCount),
           "the green context's blocks ran on %d SMs, its partition has %u", green_sms, part.sm.smCount);
    printf("blocks of the green context ran on its partition only: yes\n");
    gc_fill<<<blocks, 256, 0, s1>>>(buf, n, 1);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(s1));
    gc_add<<<blocks, 256>>>(buf, n, 2);  // the green context's default stream
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    CUstream raw = nullptr;
    check_cu(green_stream(&raw, green, CU_STREAM_NON_BLOCKING, 0), "cuGreenCtxStreamCreate");
    s2 = reinterpret_cast<cudaStream_t>(raw);
    gc_add<<<blocks, 256, 0, s2>>>(buf, n, 3);
    CHECK_LAUNCH();
    cudaEvent_t done = nullptr;
    CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CHECK(cudaEventRecord(done, s2));
    // The same through the green context itself: an event of all its work so far, and a wait its later work
    // keeps (on an event already recorded: nothing to wait for).
    cudaEvent_t all_green = nullptr;
    CHECK(cudaEventCreateWithFlags(&all_green, cudaEventDisableTiming));
    check_cu(green_record(green, reinterpret_cast<CUevent>(all_green)), "cuGreenCtxRecordEvent");
    check_cu(green_wait(green, reinterpret_cast<CUevent>(done)), "cuGreenCtxWaitEvent");
    unsigned long long id1 = 0, id2 = 0;
    check_cu(green_id(green, &id1), "cuGreenCtxGetId");
    check_cu(green_id(green, &id2), "cuGreenCtxGetId (again)");
    EXPECT(id1 != 0 && id1 == id2, "cuGreenCtxGetId gave %llu then %llu", id1, id2);
    CUgreenCtx of_s1 = nullptr, of_s2 = nullptr;
    check_cu(stream_green(reinterpret_cast<CUstream>(s1), &of_s1), "cuStreamGetGreenCtx (s1)");
    check_cu(stream_green(raw, &of_s2), "cuStreamGetGreenCtx (s2)");
    EXPECT(of_s2 == green, "cuStreamGetGreenCtx of the green context's stream gave %p",
           static_cast<void*>(of_s2));
    CUcontext ctx_of_s2 = nullptr;
    CUgreenCtx green_of_s2 = nullptr;
    check_cu(stream_ctx(raw, &ctx_of_s2, &green_of_s2), "cuStreamGetCtx_v2 (s2)");
    EXPECT(green_of_s2 == green && ctx_of_s2 == primary,
           "cuStreamGetCtx_v2 of the green context's stream: context %p (primary %p), green context %p",
           static_cast<void*>(ctx_of_s2), static_cast<void*>(primary), static_cast<void*>(green_of_s2));
    printf("the green context of a stream made under its context: %s\n",
           of_s1 == green ? "its own" : (of_s1 ? "another" : "none"));
    CUcontext popped = nullptr;
    check_cu(pop(&popped), "cuCtxPopCurrent");
    EXPECT(popped == gctx, "popped %p, not the green context", static_cast<void*>(popped));
    check_cu(get_current(&current), "cuCtxGetCurrent");
    EXPECT(current == primary, "the primary context is not current again");

    cudaStream_t ps = nullptr;
    CHECK(cudaStreamCreateWithFlags(&ps, cudaStreamNonBlocking));
    CHECK(cudaStreamWaitEvent(ps, done, 0));
    CHECK(cudaStreamWaitEvent(ps, all_green, 0));
    CUgreenCtx of_ps = nullptr;
    check_cu(stream_green(reinterpret_cast<CUstream>(ps), &of_ps), "cuStreamGetGreenCtx (primary)");
    EXPECT(of_ps == nullptr, "a stream of the primary context has green context %p",
           static_cast<void*>(of_ps));
    gc_add<<<blocks, 256, 0, ps>>>(buf, n, 4);
    CHECK_LAUNCH();
    std::vector<int> host(n);
    CHECK(cudaStreamSynchronize(ps));
    CHECK(cudaMemcpy(host.data(), buf, n * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i)
        if (host[i] != 10) fail("buf[%d] = %d, expected 1 + 2 + 3 + 4", i, host[i]);
    printf("kernels on three streams of the green context and one of the primary context: ok\n");

    CHECK(cudaEventDestroy(done));
    CHECK(cudaEventDestroy(all_green));
    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaStreamDestroy(s2));
    check_cu(green_destroy(green), "cuGreenCtxDestroy");
    gc_fill<<<blocks, 256, 0, ps>>>(buf, n, 7);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(ps));
    CHECK(cudaMemcpy(host.data(), buf, sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT(host[0] == 7, "after the green context went, the primary context's kernel wrote %d", host[0]);
    CHECK(cudaStreamDestroy(ps));
    CHECK(cudaFree(sm_ids));
    CHECK(cudaFree(buf));
    return pass();
}
