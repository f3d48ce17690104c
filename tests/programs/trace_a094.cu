// trace_a094: a probe for learning what slots [1] and [4] of the private export table a094798c do, from a
// trace of the real driver (client/TRACE.md, "Export table a094798c"). Not a compared program: run it on a
// GPU machine in record mode (VCUDA_TRACE), natively, and read the trace and what it prints.
//
// What is known (from cudart 13.0's code, client/export_tables.cpp): before each runtime API call cudart
// reads one u32 per CUPTI runtime callback id from the buffer slot [2] gave it, and where that word is set it
// calls [4] and [1] around the call: [4](a context record, &a field of a CUPTI-like callback record) and
// [1](callback id, &that record), once with the record's site word 0 (enter) and once with 1 (exit); their
// results are not read. What is not known: what [4] writes, what [1] does with the record, what size the
// driver's [2] reports.
//
// Part 1 runs a host function and lists the nodes of a captured graph with no CUPTI subscriber: the driver
// should leave every switch off, so the trace should show no call of [1] or [4]. Part 2 (with the argument
// `cupti`) subscribes to CUPTI's runtime callbacks for cudaGraphGetNodes (libcupti.so.13 loaded at run time:
// beside this program, or from LD_LIBRARY_PATH) and lists the nodes again: the switch for id 322 should be
// set and the trace should show [4] and [1]; the callback prints what CUPTI handed it, to compare with their
// words.
#include <cuda_runtime.h>
#include <cupti.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "common.cuh"

namespace {

void CUDART_CB host_work(void* p) { ++*static_cast<int*>(p); }

size_t list_nodes(cudaGraph_t g) {
    size_t n = 0;
    CHECK(cudaGraphGetNodes(g, nullptr, &n));
    return n;
}

void CUPTIAPI on_runtime_api(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void* data) {
    const auto* d = static_cast<const CUpti_CallbackData*>(data);
    printf(
        "info: CUPTI callback: domain %d id %u site %s function %s context %p context uid %u correlation %u "
        "record %p\n",
        static_cast<int>(domain), id, d->callbackSite == CUPTI_API_ENTER ? "enter" : "exit",
        d->functionName ? d->functionName : "?", static_cast<void*>(d->context), d->contextUid,
        d->correlationId, data);
}

// libcupti.so.13 beside this program, else as the dynamic loader finds it.
void* load_cupti() {
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        std::string dir(self, static_cast<size_t>(n));
        dir.resize(dir.rfind('/') + 1);
        if (void* h = dlopen((dir + "libcupti.so.13").c_str(), RTLD_NOW)) return h;
    }
    return dlopen("libcupti.so.13", RTLD_NOW);
}

}  // namespace

int main(int argc, char** argv) {
    const bool with_cupti = argc > 1 && std::string(argv[1]) == "cupti";
    int ran = 0;
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK(cudaLaunchHostFunc(s, host_work, &ran));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    CHECK(cudaLaunchHostFunc(s, host_work, &ran));
    cudaGraph_t g;
    CHECK(cudaStreamEndCapture(s, &g));
    printf("part 1: %zu node(s) listed, host function ran %d time(s)\n", list_nodes(g), ran);
    if (with_cupti) {
        void* cupti = load_cupti();
        EXPECT(cupti, "libcupti.so.13 not found: %s", dlerror());
        using subscribe_fn = CUptiResult (*)(CUpti_SubscriberHandle*, CUpti_CallbackFunc, void*);
        using enable_fn =
            CUptiResult (*)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain, CUpti_CallbackId);
        using unsubscribe_fn = CUptiResult (*)(CUpti_SubscriberHandle);
        auto subscribe = reinterpret_cast<subscribe_fn>(dlsym(cupti, "cuptiSubscribe"));
        auto enable = reinterpret_cast<enable_fn>(dlsym(cupti, "cuptiEnableCallback"));
        auto unsubscribe = reinterpret_cast<unsubscribe_fn>(dlsym(cupti, "cuptiUnsubscribe"));
        EXPECT(subscribe && enable && unsubscribe, "libcupti.so.13 lacks the callback API");
        CUpti_SubscriberHandle sub = nullptr;
        EXPECT(
            subscribe(&sub, reinterpret_cast<CUpti_CallbackFunc>(on_runtime_api), nullptr) == CUPTI_SUCCESS,
            "cuptiSubscribe failed");
        EXPECT(enable(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API,
                      CUPTI_RUNTIME_TRACE_CBID_cudaGraphGetNodes_v10000) == CUPTI_SUCCESS,
               "cuptiEnableCallback failed");
        printf("part 2: %zu node(s) listed with a CUPTI subscriber\n", list_nodes(g));
        unsubscribe(sub);
    }
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaStreamDestroy(s));
    return pass();
}
