// error_cases: the errors a program sees for bad input, printed by name so that native and vcuda runs can be
// compared. In this process: bad launch shapes (0 or 2048 threads per block, an empty grid, a block dimension
// past its limit, a grid dimension past its limit, too much dynamic shared memory), a bad device ordinal, an
// impossible allocation, cudaFree of a bogus pointer — none of them sticky, as the final launch shows.
// In child processes (this program run again with `--case NAME`, so that a crash, should the driver crash
// on undefined use, is reported instead of ending the run): copies and memsets with bogus device pointers, a
// double free, and synchronize/query/destroy on destroyed and bogus stream
// and event handles.
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "common.cuh"

extern "C" __global__ void ec_fill(int* p, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}

static void* const bogus_ptr = reinterpret_cast<void*>(0x10000);  // below every mapping the driver makes

// --------------------------------------------------------------------------------------- child cases
static int run_case(const std::string& c) {
    cudaError_t e = cudaErrorUnknown;
    CHECK(cudaFree(nullptr));  // initialize the context first: the case's error is then the case's own
    std::vector<char> h(1 << 20);
    if (c == "memcpy_dtoh_bogus") {
        e = cudaMemcpy(h.data(), bogus_ptr, 4096, cudaMemcpyDeviceToHost);
    } else if (c == "memcpy_htod_bogus") {
        e = cudaMemcpy(bogus_ptr, h.data(), 4096, cudaMemcpyHostToDevice);
    } else if (c == "memcpy_dtod_bogus") {
        void* d;
        CHECK(cudaMalloc(&d, 4096));
        e = cudaMemcpy(d, bogus_ptr, 4096, cudaMemcpyDeviceToDevice);
    } else if (c == "memset_bogus") {
        e = cudaMemset(bogus_ptr, 0, 4096);
    } else if (c == "free_twice") {
        void* d;
        CHECK(cudaMalloc(&d, 4096));
        CHECK(cudaFree(d));
        e = cudaFree(d);
    } else if (c == "stream_sync_destroyed") {
        cudaStream_t s;
        CHECK(cudaStreamCreate(&s));
        CHECK(cudaStreamDestroy(s));
        e = cudaStreamSynchronize(s);
    } else if (c == "stream_sync_bogus") {
        e = cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(0x1234560));
    } else if (c == "stream_destroy_twice") {
        cudaStream_t s;
        CHECK(cudaStreamCreate(&s));
        CHECK(cudaStreamDestroy(s));
        e = cudaStreamDestroy(s);
    } else if (c == "event_query_destroyed") {
        cudaEvent_t ev;
        CHECK(cudaEventCreate(&ev));
        CHECK(cudaEventRecord(ev, 0));
        CHECK(cudaEventSynchronize(ev));
        CHECK(cudaEventDestroy(ev));
        e = cudaEventQuery(ev);
    } else if (c == "event_query_bogus") {
        e = cudaEventQuery(reinterpret_cast<cudaEvent_t>(0x7654320));
    } else if (c == "event_record_bogus") {
        e = cudaEventRecord(reinterpret_cast<cudaEvent_t>(0x7654320), 0);
    } else {
        fail("unknown case %s", c.c_str());
    }
    printf("RESULT %s\n", cudaGetErrorName(e));
    fflush(stdout);
    return 0;
}

struct child_result {
    std::string text;  // an error name, or how the child ended
    bool error;        // the call returned an error (not cudaSuccess)
    bool crashed;      // the child died of a signal
};

static child_result in_child(const char* self, const char* name) {
    int fd[2];
    EXPECT(pipe(fd) == 0, "pipe failed");
    fflush(stdout);
    pid_t pid = fork();
    EXPECT(pid >= 0, "fork failed");
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        execl(self, self, "--case", name, static_cast<char*>(nullptr));
        _exit(127);
    }
    close(fd[1]);
    std::string out;
    char buf[4096];
    ssize_t k;
    while ((k = read(fd[0], buf, sizeof buf)) > 0) out.append(buf, size_t(k));
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    size_t at = out.find("RESULT ");
    if (at != std::string::npos) {
        std::string r = out.substr(at + 7);
        r = r.substr(0, r.find('\n'));
        return {r, r != "cudaSuccess", false};
    }
    if (WIFSIGNALED(status))
        return {"child killed by signal " + std::to_string(WTERMSIG(status)), false, true};
    std::string first = out.substr(0, out.find('\n'));
    return {"child exited " + std::to_string(WEXITSTATUS(status)) + " without a result (" + first + ")",
            false, false};
}

// --------------------------------------------------------------------------------------- main process
static cudaError_t launch_error(dim3 grid, dim3 block, size_t shmem, int* d) {
    ec_fill<<<grid, block, shmem>>>(d, 1, 1);
    return cudaGetLastError();
}

int main(int argc, char** argv) {
    if (argc == 3 && strcmp(argv[1], "--case") == 0) return run_case(argv[2]);

    int* d;
    CHECK(cudaMalloc(&d, 1024 * sizeof(int)));

    struct shape {
        const char* what;
        dim3 grid, block;
        size_t shmem;
        cudaError_t expect;
    };
    // Measured with CUDA 13.0 and driver 580 on an H100/H200: every bad shape is cudaErrorInvalidValue at
    // launch (older runtimes answered cudaErrorInvalidConfiguration for some of them).
    const shape shapes[] = {
        {"0 threads per block", dim3(1), dim3(0), 0, cudaErrorInvalidValue},
        {"2048 threads per block", dim3(1), dim3(2048), 0, cudaErrorInvalidValue},
        {"block 32x32x2 (2048 threads)", dim3(1), dim3(32, 32, 2), 0, cudaErrorInvalidValue},
        {"block z = 65", dim3(1), dim3(1, 1, 65), 0, cudaErrorInvalidValue},
        {"empty grid", dim3(0), dim3(32), 0, cudaErrorInvalidValue},
        {"grid y = 65536", dim3(1, 65536), dim3(32), 0, cudaErrorInvalidValue},
        {"1 MiB of dynamic shared memory", dim3(1), dim3(32), 1 << 20, cudaErrorInvalidValue},
    };
    for (const auto& s : shapes) {
        cudaError_t e = launch_error(s.grid, s.block, s.shmem, d);
        printf("launch with %s: %s\n", s.what, cudaGetErrorName(e));
        EXPECT(e == s.expect, "launch with %s returned %s, expected %s", s.what, cudaGetErrorName(e),
               cudaGetErrorName(s.expect));
        EXPECT(cudaGetLastError() == cudaSuccess, "the error of '%s' stayed", s.what);
    }

    {
        cudaError_t e = cudaSetDevice(9999);
        printf("cudaSetDevice(9999): %s\n", cudaGetErrorName(e));
        EXPECT(e == cudaErrorInvalidDevice, "cudaSetDevice(9999) returned %s", cudaGetErrorName(e));
        (void)cudaGetLastError();
        CHECK(cudaSetDevice(0));
    }
    {
        void* huge = nullptr;
        cudaError_t e = cudaMalloc(&huge, size_t(1) << 50);
        printf("cudaMalloc(1 PiB): %s\n", cudaGetErrorName(e));
        EXPECT(e == cudaErrorMemoryAllocation, "cudaMalloc(1 PiB) returned %s", cudaGetErrorName(e));
        (void)cudaGetLastError();
    }
    {
        cudaError_t e = cudaFree(bogus_ptr);
        printf("cudaFree(bogus pointer): %s\n", cudaGetErrorName(e));
        EXPECT(e != cudaSuccess, "cudaFree of a bogus pointer succeeded");
        (void)cudaGetLastError();
    }
    {
        int* inside = d + 16;
        cudaError_t e = cudaFree(inside);
        printf("cudaFree(pointer inside an allocation): %s\n", cudaGetErrorName(e));
        EXPECT(e != cudaSuccess, "cudaFree inside an allocation succeeded");
        (void)cudaGetLastError();
    }
    {
        cudaError_t e = cudaMemcpy(d, d + 512, 0, cudaMemcpyDeviceToDevice);
        printf("cudaMemcpy of 0 bytes: %s\n", cudaGetErrorName(e));
    }
    {
        const cudaError_t codes[] = {cudaSuccess,
                                     cudaErrorInvalidValue,
                                     cudaErrorMemoryAllocation,
                                     cudaErrorInvalidConfiguration,
                                     cudaErrorInvalidResourceHandle,
                                     cudaErrorNotReady,
                                     cudaErrorIllegalAddress,
                                     static_cast<cudaError_t>(9999)};
        for (cudaError_t c : codes)
            printf("error %d: %s / %s\n", static_cast<int>(c), cudaGetErrorName(c), cudaGetErrorString(c));
    }

    // Child cases. Errors expected; what exactly each returns is compared between native and vcuda.
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    EXPECT(len > 0, "readlink /proc/self/exe failed");
    self[len] = 0;
    // Bogus pointers get a defined error (cudaErrorInvalidValue natively), compared by name. Destroyed and
    // bogus stream and event handles are undefined use: the native driver 580 dereferences them and the child
    // dies of SIGSEGV; vcuda checks every handle and returns an error. Both refuse the call, which is what is
    // compared ("refused"); the exact outcome is printed as info:. Only success would be wrong.
    struct child_case {
        const char* name;
        bool must_fail;  // a defined error, compared by name; else undefined use, compared as refused or not
    };
    const child_case cases[] = {
        {"memcpy_dtoh_bogus", true},
        {"memcpy_htod_bogus", true},
        {"memcpy_dtod_bogus", true},
        {"memset_bogus", true},
        {"free_twice", true},
        {"stream_sync_destroyed", false},
        {"stream_sync_bogus", false},
        {"stream_destroy_twice", false},
        {"event_query_destroyed", false},
        {"event_query_bogus", false},
        {"event_record_bogus", false},
    };
    for (const auto& c : cases) {
        child_result r = in_child(self, c.name);
        if (c.must_fail) {
            printf("%s: %s\n", c.name, r.text.c_str());
            EXPECT(r.error, "%s: expected an error, got %s", c.name, r.text.c_str());
        } else {
            printf("%s: %s\n", c.name, r.error || r.crashed ? "refused" : "NOT refused");
            printf("info: %s: %s\n", c.name, r.text.c_str());
            EXPECT(r.error || r.crashed, "%s: the call was not refused (%s)", c.name, r.text.c_str());
        }
    }

    // Nothing above is sticky: a normal launch and copy still work.
    ec_fill<<<4, 256>>>(d, 1024, 42);
    CHECK_LAUNCH();
    int h[1024];
    CHECK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 1024; ++i) EXPECT(h[i] == 42, "after the errors: h[%d] = %d", i, h[i]);
    printf("launch after the errors: ok\n");
    CHECK(cudaFree(d));
    return pass();
}
