// launch_events: launches that record events through their attributes, as programmatic dependent launch uses
// them on Hopper — a programmatic event another stream waits on (its kernel waits in cudaGridDependency-
// Synchronize), a launch completion event the host synchronizes with, and a dependent launch in the same
// stream (programmatic stream serialization). Each result is checked on the host.
#include <cuda_runtime.h>

#include <vector>

#include "common.cuh"

// p[i] = i * k, then this block's trigger: what it wrote is visible to a dependent after its grid sync.
extern "C" __global__ void le_produce(int* p, int n, int k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = i * k;
#if __CUDA_ARCH__ >= 900
    cudaTriggerProgrammaticLaunchCompletion();
#endif
}

// q[i] = p[i] + 1, once the kernel it depends on has triggered (a no-op without a programmatic dependency).
extern "C" __global__ void le_consume(const int* p, int* q, int n) {
#if __CUDA_ARCH__ >= 900
    cudaGridDependencySynchronize();
#endif
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) q[i] = p[i] + 1;
}

static void check(const int* q, int n, int k, const char* what) {
    std::vector<int> h(n);
    CHECK(cudaMemcpy(h.data(), q, n * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i)
        EXPECT(h[i] == i * k + 1, "%s: [%d] = %d, expected %d", what, i, h[i], i * k + 1);
    printf("%s: %d results right\n", what, n);
}

int main() {
    const int n = 1 << 20;
    int *p = nullptr, *q = nullptr;
    CHECK(cudaMalloc(&p, n * sizeof(int)));
    CHECK(cudaMalloc(&q, n * sizeof(int)));
    cudaStream_t s1, s2;
    CHECK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t programmatic, completion;
    CHECK(cudaEventCreateWithFlags(&programmatic, cudaEventDisableTiming));
    CHECK(cudaEventCreateWithFlags(&completion, cudaEventDisableTiming));

    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3((n + 255) / 256);
    cfg.blockDim = dim3(256);
    cudaLaunchAttribute attr[1]{};
    cfg.attrs = attr;
    cfg.numAttrs = 1;

    // A programmatic event recorded by the producer on s1; the consumer on s2 waits for it.
    CHECK(cudaMemsetAsync(q, 0, n * sizeof(int), s2));
    attr[0].id = cudaLaunchAttributeProgrammaticEvent;
    attr[0].val.programmaticEvent.event = programmatic;
    attr[0].val.programmaticEvent.flags = 0;
    attr[0].val.programmaticEvent.triggerAtBlockStart = 0;
    cfg.stream = s1;
    CHECK(cudaLaunchKernelEx(&cfg, le_produce, p, n, 3));
    CHECK(cudaStreamWaitEvent(s2, programmatic, 0));
    le_consume<<<(n + 255) / 256, 256, 0, s2>>>(p, q, n);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(s2));
    CHECK(cudaStreamSynchronize(s1));
    CHECK(cudaEventQuery(programmatic));
    check(q, n, 3, "programmatic event waited on by another stream");

    // A launch completion event: the host waits for it, then for the stream.
    attr[0] = {};
    attr[0].id = cudaLaunchAttributeLaunchCompletionEvent;
    attr[0].val.launchCompletionEvent.event = completion;
    attr[0].val.launchCompletionEvent.flags = 0;
    CHECK(cudaLaunchKernelEx(&cfg, le_produce, p, n, 5));
    CHECK(cudaEventSynchronize(completion));
    CHECK(cudaStreamSynchronize(s1));
    CHECK(cudaEventQuery(completion));
    le_consume<<<(n + 255) / 256, 256, 0, s1>>>(p, q, n);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(s1));
    check(q, n, 5, "launch completion event");

    // A dependent launch in the same stream: it may start before the producer ends, and waits in the kernel.
    CHECK(cudaLaunchKernelEx(&cfg, le_produce, p, n, 7));
    attr[0] = {};
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    CHECK(cudaLaunchKernelEx(&cfg, le_consume, static_cast<const int*>(p), q, n));
    CHECK(cudaStreamSynchronize(s1));
    check(q, n, 7, "programmatic stream serialization");

    // Both events again, recorded by one launch.
    cudaLaunchAttribute both[2]{};
    both[0].id = cudaLaunchAttributeProgrammaticEvent;
    both[0].val.programmaticEvent.event = programmatic;
    both[1].id = cudaLaunchAttributeLaunchCompletionEvent;
    both[1].val.launchCompletionEvent.event = completion;
    cfg.attrs = both;
    cfg.numAttrs = 2;
    CHECK(cudaLaunchKernelEx(&cfg, le_produce, p, n, 9));
    CHECK(cudaStreamWaitEvent(s2, programmatic, 0));
    le_consume<<<(n + 255) / 256, 256, 0, s2>>>(p, q, n);
    CHECK_LAUNCH();
    CHECK(cudaEventSynchronize(completion));
    CHECK(cudaDeviceSynchronize());
    check(q, n, 9, "both events from one launch");

    CHECK(cudaEventDestroy(programmatic));
    CHECK(cudaEventDestroy(completion));
    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaStreamDestroy(s2));
    CHECK(cudaFree(p));
    CHECK(cudaFree(q));
    return pass();
}
