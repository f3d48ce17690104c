// managed_memory: cudaMallocManaged memory used from both sides, the way a program written for a GPU without
// concurrent managed access must (synchronize before the CPU touches it): CPU writes -> kernel reads and
// writes -> CPU reads, over several rounds and partial writes; a range of several MiB touched sparsely;
// cudaMemcpy and cudaMemset with managed pointers on either side (explicit kinds and cudaMemcpyDefault);
// prefetch to the device and back to the CPU; advice and range attributes; pointer attributes; memory
// attached to the host then to one stream; two CPU threads reading at once; free and allocate again.
// `managed_memory chained-handler`: the program's own SIGSEGV handler, installed before any managed memory,
// still gets the faults that are not managed memory's (it reports one and exits 3).
#include <cuda_runtime.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common.cuh"

// a[i] = a[i] * mul + add
extern "C" __global__ void mm_affine(int* a, int n, int mul, int add) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] = a[i] * mul + add;
}

// out[i] = x[i] + y[i]
extern "C" __global__ void mm_sum(const int* x, const int* y, int* out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + y[i];
}

static void affine(int* a, int n, int mul, int add, cudaStream_t s = nullptr) {
    mm_affine<<<(n + 255) / 256, 256, 0, s>>>(a, n, mul, add);
    CHECK_LAUNCH();
}

static cudaMemLocation device_location(int d) {
    cudaMemLocation l{};
    l.type = cudaMemLocationTypeDevice;
    l.id = d;
    return l;
}

static cudaMemLocation host_location() {
    cudaMemLocation l{};
    l.type = cudaMemLocationTypeHost;
    return l;
}

static void application_handler(int) {
    static const char line[] = "the application's SIGSEGV handler got a fault outside managed memory\n";
    (void)!write(1, line, sizeof line - 1);
    _exit(3);
}

static int chained_handler() {
    struct sigaction sa {};
    sa.sa_handler = application_handler;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, nullptr) != 0) fail("sigaction");
    int* m = nullptr;
    CHECK(cudaMallocManaged(&m, 4096 * sizeof(int)));
    affine(m, 4096, 1, 9);
    CHECK(cudaDeviceSynchronize());
    if (m[100] != 9) fail("managed memory read %d", m[100]);  // a fault vcuda serves, natively none
    printf("managed memory read after a kernel: ok\n");
    fflush(stdout);
    void* guard = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (guard == MAP_FAILED) fail("mmap");
    *static_cast<volatile int*>(guard) = 1;  // the application's own fault
    fail("a write to a PROT_NONE page did not fault");
}

int main(int argc, char** argv) {
    if (argc == 2 && std::string(argv[1]) == "chained-handler") return chained_handler();
    int dev = 0;
    CHECK(cudaSetDevice(dev));
    int managed = 0, concurrent = 0;
    CHECK(cudaDeviceGetAttribute(&managed, cudaDevAttrManagedMemory, dev));
    CHECK(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, dev));
    printf("managed memory supported: %d\n", managed);
    printf("info: concurrent managed access: %d\n", concurrent);
    if (!managed) fail("the device has no managed memory");

    // 1. CPU writes -> kernel reads and writes -> CPU reads, three rounds; the second round's CPU writes
    // cover only the first half, so the rest must keep the kernel's values.
    const int n = 100000;
    int* a = nullptr;
    CHECK(cudaMallocManaged(&a, n * sizeof(int)));
    for (int i = 0; i < n; ++i) a[i] = i;
    std::vector<int> want(n);
    for (int i = 0; i < n; ++i) want[i] = i;
    for (int round = 0; round < 3; ++round) {
        affine(a, n, 3, round + 1);
        CHECK(cudaDeviceSynchronize());
        for (int i = 0; i < n; ++i) want[i] = want[i] * 3 + round + 1;
        for (int i = 0; i < n; ++i)
            if (a[i] != want[i]) fail("round %d: a[%d] = %d, want %d", round, i, a[i], want[i]);
        for (int i = 0; i < n / 2; ++i) a[i] = want[i] = i % 977;
    }
    long long sum = 0;
    for (int i = 0; i < n; ++i) sum += a[i];
    printf("cpu -> kernel -> cpu, 3 rounds with partial cpu writes: ok, sum %lld\n", sum);

    // 2. Several MiB touched sparsely by the CPU: only what it wrote changes, the rest keeps the kernel's.
    const int big =
        (7 << 20) / sizeof(int) + 123;  // 7 MiB and a bit: several fetch units, a partial last one
    int* b = nullptr;
    CHECK(cudaMallocManaged(&b, big * sizeof(int)));
    CHECK(cudaMemset(b, 0, big * sizeof(int)));
    affine(b, big, 1, 5);  // all 5
    CHECK(cudaDeviceSynchronize());
    const int stride = (1 << 20) / sizeof(int) + 7;
    for (int i = 0; i < big; i += stride) b[i] = -i;
    b[big - 1] = 42;
    affine(b, big, 2, 0);
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < big; ++i) {
        int w = i == big - 1 ? 84 : (i % stride == 0 ? -2 * i : 10);
        if (b[i] != w) fail("sparse: b[%d] = %d, want %d", i, b[i], w);
    }
    printf("7 MiB touched sparsely by the cpu: ok\n");

    // 3. Copies and sets with managed pointers on either side.
    int* d = nullptr;
    CHECK(cudaMalloc(&d, n * sizeof(int)));
    std::vector<int> host(n);
    for (int i = 0; i < n; ++i) a[i] = 7 * i;
    CHECK(cudaMemcpy(d, a, n * sizeof(int), cudaMemcpyHostToDevice));  // a managed "host" source
    affine(d, n, 1, 1);
    CHECK(cudaMemcpy(a, d, n * sizeof(int), cudaMemcpyDeviceToHost));  // a managed "host" destination
    for (int i = 0; i < n; ++i)
        if (a[i] != 7 * i + 1) fail("copies: a[%d] = %d", i, a[i]);
    CHECK(cudaMemcpy(host.data(), a, n * sizeof(int), cudaMemcpyDefault));
    for (int i = 0; i < n; ++i)
        if (host[i] != 7 * i + 1) fail("copy to the host: host[%d] = %d", i, host[i]);
    for (int i = 0; i < n; ++i) host[i] = -i;
    CHECK(cudaMemcpy(a, host.data(), n * sizeof(int), cudaMemcpyDefault));
    for (int i = 0; i < n; ++i)
        if (a[i] != -i) fail("copy from the host: a[%d] = %d", i, a[i]);
    a[0] = 99;  // a dirty chunk, then a copy reading it
    CHECK(cudaMemcpy(d, a, sizeof(int), cudaMemcpyDefault));
    CHECK(cudaMemcpy(&host[0], d, sizeof(int), cudaMemcpyDeviceToHost));
    if (host[0] != 99) fail("a cpu write before a copy: %d", host[0]);
    CHECK(cudaMemset(a, 0x01, n * sizeof(int)));
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < n; ++i)
        if (a[i] != 0x01010101) fail("memset: a[%d] = %#x", i, a[i]);
    printf("cudaMemcpy and cudaMemset with managed pointers: ok\n");

    // 4. Pointer attributes.
    cudaPointerAttributes pa{};
    CHECK(cudaPointerGetAttributes(&pa, a + 10));
    printf("pointer attributes: type %s, device %d, device pointer %s, host pointer %s\n",
           pa.type == cudaMemoryTypeManaged ? "managed" : "other", pa.device,
           pa.devicePointer == a + 10 ? "same" : "different",
           pa.hostPointer == a + 10 ? "same" : "different");

    // 5. Prefetch to the device, a kernel, prefetch back to the CPU; the last prefetch location.
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    for (int i = 0; i < n; ++i) a[i] = i;
    CHECK(cudaMemPrefetchAsync(a, n * sizeof(int), device_location(dev), 0, s));
    affine(a, n, 2, 0, s);
    CHECK(cudaMemPrefetchAsync(a, n * sizeof(int), host_location(), 0, s));
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; ++i)
        if (a[i] != 2 * i) fail("prefetch: a[%d] = %d", i, a[i]);
    int last = 0;
    CHECK(cudaMemRangeGetAttribute(&last, sizeof last, cudaMemRangeAttributeLastPrefetchLocation, a,
                                   n * sizeof(int)));
    printf("prefetch to the device and back: ok, last prefetch location %s\n",
           last == cudaCpuDeviceId ? "cpu" : "other");

    // 6. Advice and range attributes.
    CHECK(cudaMemAdvise(a, n * sizeof(int), cudaMemAdviseSetReadMostly, device_location(dev)));
    CHECK(cudaMemAdvise(a, n * sizeof(int), cudaMemAdviseSetPreferredLocation, device_location(dev)));
    CHECK(cudaMemAdvise(a, n * sizeof(int), cudaMemAdviseSetAccessedBy, device_location(dev)));
    int read_mostly = -1, preferred = -9, accessed[3] = {-9, -9, -9};
    CHECK(cudaMemRangeGetAttribute(&read_mostly, sizeof read_mostly, cudaMemRangeAttributeReadMostly, a,
                                   n * sizeof(int)));
    CHECK(cudaMemRangeGetAttribute(&preferred, sizeof preferred, cudaMemRangeAttributePreferredLocation, a,
                                   n * sizeof(int)));
    CHECK(cudaMemRangeGetAttribute(accessed, sizeof accessed, cudaMemRangeAttributeAccessedBy, a,
                                   n * sizeof(int)));
    printf("advice: read mostly %d, preferred location %d, accessed by %d %d %d\n", read_mostly, preferred,
           accessed[0], accessed[1], accessed[2]);
    CHECK(cudaMemAdvise(a, n * sizeof(int), cudaMemAdviseUnsetReadMostly, device_location(dev)));
    CHECK(cudaMemRangeGetAttribute(&read_mostly, sizeof read_mostly, cudaMemRangeAttributeReadMostly, a,
                                   n * sizeof(int)));
    printf("advice unset: read mostly %d\n", read_mostly);
    affine(a, n, 1, 1);  // advice changes nothing a program sees
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < n; ++i)
        if (a[i] != 2 * i + 1) fail("after advice: a[%d] = %d", i, a[i]);

    // 7. Attached to the host at allocation, then to one stream for a kernel.
    int *x = nullptr, *y = nullptr;
    CHECK(cudaMallocManaged(&x, n * sizeof(int), cudaMemAttachHost));
    CHECK(cudaMallocManaged(&y, n * sizeof(int), cudaMemAttachHost));
    for (int i = 0; i < n; ++i) x[i] = i, y[i] = 1000;
    CHECK(cudaStreamAttachMemAsync(s, x, 0, cudaMemAttachSingle));
    CHECK(cudaStreamAttachMemAsync(s, y, 0, cudaMemAttachSingle));
    mm_sum<<<(n + 255) / 256, 256, 0, s>>>(x, y, y, n);
    CHECK_LAUNCH();
    CHECK(cudaStreamSynchronize(s));
    for (int i = 0; i < n; ++i)
        if (y[i] != i + 1000) fail("attached to a stream: y[%d] = %d", i, y[i]);
    printf("attached to the host, then to a stream: ok\n");

    // 8. Two CPU threads read different halves of device-written data at once.
    affine(b, big, 1, 1);
    CHECK(cudaDeviceSynchronize());
    long long halves[2] = {0, 0};
    std::thread readers[2];
    for (int t = 0; t < 2; ++t)
        readers[t] = std::thread([&, t] {
            for (int i = t * (big / 2); i < (t ? big : big / 2); ++i) halves[t] += b[i];
        });
    for (auto& r : readers) r.join();
    long long expect = 0;
    for (int i = 0; i < big; ++i) expect += (i == big - 1 ? 84 : (i % stride == 0 ? -2 * i : 10)) + 1;
    if (halves[0] + halves[1] != expect) fail("two readers: %lld, want %lld", halves[0] + halves[1], expect);
    printf("two cpu threads reading at once: ok\n");

    // 9. Free and allocate again, many times, sizes around the fetch unit.
    CHECK(cudaFree(b));
    CHECK(cudaFree(x));
    CHECK(cudaFree(y));
    for (int k = 0; k < 8; ++k) {
        const int m = (k + 1) * 65536 + k;
        int* p = nullptr;
        CHECK(cudaMallocManaged(&p, m * sizeof(int)));
        for (int i = 0; i < m; ++i) p[i] = i + k;
        affine(p, m, 1, -k);
        CHECK(cudaDeviceSynchronize());
        for (int i = 0; i < m; i += 997)
            if (p[i] != i) fail("realloc %d: p[%d] = %d", k, i, p[i]);
        CHECK(cudaFree(p));
    }
    printf("free and allocate again, 8 times: ok\n");

    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(d));
    CHECK(cudaFree(a));
    return pass();
}
