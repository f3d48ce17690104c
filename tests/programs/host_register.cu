// host_register: the application's own memory registered with cudaHostRegister. Mapped
// (cudaHostRegisterMapped, with Portable, and ReadOnly for the input): a kernel reads one malloc'd buffer and
// writes another through the device pointers cudaHostGetDevicePointer gives; the host sees the results after
// a synchronize, and its own writes reach the next launch. The buffers keep their contents across
// registration and unregistration, and register mapped again. Default flags: copies from and into the
// registered buffer. Through vcuda the mapped part needs a server on this host (Unix socket): over TCP
// cudaHostRegister(Mapped) answers cudaErrorNotSupported, which the program reports as its one line and stops
// with exit code 3 (see tests/programs/CMakeLists.txt).
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "common.cuh"

extern "C" __global__ void hr_times3_plus(const unsigned* in, unsigned* out, int n, unsigned k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * 3u + k;
}

// `host_register unmapped-launch`: a kernel given the host pointer of memory registered with default flags
// (not Mapped), which it reads and writes. Through vcuda the kernel runs on a device copy of the registered
// range (client/api_launch.cpp). Natively it depends on the device
// (tests/gpu/probes/registered_kernel_access.cu asks the driver); a device that refuses answers
// cudaErrorNotSupported, reported with exit 3.
int unmapped_launch() {
    const int n = 4096;
    auto* buf = static_cast<unsigned*>(std::malloc(n * sizeof(unsigned)));
    if (!buf) fail("malloc");
    for (int i = 0; i < n; ++i) buf[i] = static_cast<unsigned>(i);
    CHECK(cudaFree(nullptr));
    CHECK(cudaHostRegister(buf, n * sizeof(unsigned), cudaHostRegisterDefault));
    hr_times3_plus<<<n / 256, 256>>>(buf, buf, n, 1);
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e == cudaErrorNotSupported) {
        std::printf("a kernel on memory registered without the mapped flag: %s\n", cudaGetErrorName(e));
        return 3;
    }
    CHECK(e);
    for (int i = 0; i < n; ++i)
        if (buf[i] != static_cast<unsigned>(i) * 3u + 1u) fail("buf[%d] = %u", i, buf[i]);
    // Registered read-only, the pages then write-protected: the kernel only reads them (through vcuda nothing
    // is written back into them: a write would end the program with SIGSEGV).
    int read_only = 0;
    CHECK(cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, 0));
    if (read_only) {
        const size_t page = 4096, bytes = n * sizeof(unsigned);
        auto* ro = static_cast<unsigned*>(std::aligned_alloc(page, bytes));
        if (!ro) fail("aligned_alloc");
        for (int i = 0; i < n; ++i) ro[i] = static_cast<unsigned>(2 * i);
        CHECK(cudaHostRegister(ro, bytes, cudaHostRegisterReadOnly));
        if (mprotect(ro, bytes, PROT_READ) != 0) fail("mprotect");
        hr_times3_plus<<<n / 256, 256>>>(ro, buf, n, 2);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        for (int i = 0; i < n; ++i)
            if (buf[i] != static_cast<unsigned>(2 * i) * 3u + 2u)
                fail("from read-only: buf[%d] = %u", i, buf[i]);
        if (mprotect(ro, bytes, PROT_READ | PROT_WRITE) != 0) fail("mprotect");
        CHECK(cudaHostUnregister(ro));
        std::free(ro);
        std::printf("a kernel read memory registered read-only and write-protected: ok\n");
    }
    CHECK(cudaHostUnregister(buf));
    std::free(buf);
    return pass();
}

// `host_register shared-file`: pages of a file in /dev/shm mapped MAP_SHARED by two processes, each
// registering its own mapping mapped, as NCCL's shared-memory transport does. The parent closes its
// descriptor before registering (the file still has its name); the child unlinks the name first and keeps its
// descriptor open (NCCL's attaching side). A kernel of each writes through its own device pointer: the other
// process sees the bytes. Through vcuda each process is a session of its own; over TCP the registration
// answers cudaErrorNotSupported (exit 3), as for the main case. The file's length is not whole pages (NCCL's
// segments end with a 4-byte reference count).
int shared_file() {
    const int n = 50000;
    const size_t bytes = n * sizeof(unsigned) + 4;
    char path[] = "/dev/shm/vcuda-hr-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(bytes)) != 0) fail("creating %s", path);
    int to_child[2], to_parent[2];
    if (pipe(to_child) != 0 || pipe(to_parent) != 0) fail("pipe");
    const pid_t child = fork();  // before any CUDA call: each process starts its own
    if (child < 0) fail("fork");
    char token = 0;
    if (child == 0) {
        if (read(to_child[0], &token, 1) != 1) _exit(1);
        const int cfd = open(path, O_RDWR);
        if (cfd < 0) fail("child: open");
        auto* view = static_cast<unsigned*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, cfd, 0));
        if (view == MAP_FAILED) fail("child: mmap");
        unlink(path);
        cudaError_t e = cudaHostRegister(view, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
        if (e == cudaErrorNotSupported) _exit(3);
        CHECK(e);
        unsigned* d_view = nullptr;
        CHECK(cudaHostGetDevicePointer(&d_view, view, 0));
        hr_times3_plus<<<(n + 255) / 256, 256>>>(d_view, d_view, n, 2);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        for (int i = 0; i < n; ++i)
            if (view[i] != (static_cast<unsigned>(i) * 3u + 1u) * 3u + 2u)
                fail("child: view[%d] = %u", i, view[i]);
        CHECK(cudaHostUnregister(view));
        munmap(view, bytes);
        close(cfd);
        if (write(to_parent[1], "d", 1) != 1) _exit(1);
        _exit(0);
    }
    auto* view = static_cast<unsigned*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    if (view == MAP_FAILED) fail("mmap");
    close(fd);
    for (int i = 0; i < n; ++i) view[i] = static_cast<unsigned>(i);
    CHECK(cudaFree(nullptr));
    cudaError_t e = cudaHostRegister(view, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
    if (e == cudaErrorNotSupported) {
        std::printf("mapped registered host memory not supported here: %s\n", cudaGetErrorName(e));
        kill(child, SIGKILL);
        waitpid(child, nullptr, 0);
        unlink(path);
        return 3;
    }
    CHECK(e);
    unsigned* d_view = nullptr;
    CHECK(cudaHostGetDevicePointer(&d_view, view, 0));
    hr_times3_plus<<<(n + 255) / 256, 256>>>(d_view, d_view, n, 1);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::printf("parent's kernel wrote the shared file through its device pointer\n");
    if (write(to_child[1], "g", 1) != 1) fail("pipe write");
    int status = 0;
    if (read(to_parent[0], &token, 1) != 1 || waitpid(child, &status, 0) != child || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0)
        fail("the child failed (status %d)", status);
    for (int i = 0; i < n; ++i)
        if (view[i] != (static_cast<unsigned>(i) * 3u + 1u) * 3u + 2u) fail("view[%d] = %u", i, view[i]);
    std::printf("the child's kernel wrote the same pages through its own registration: ok\n");
    CHECK(cudaHostUnregister(view));
    munmap(view, bytes);
    return pass();
}

int main(int argc, char** argv) {
    if (argc > 1 && std::strcmp(argv[1], "unmapped-launch") == 0) return unmapped_launch();
    if (argc > 1 && std::strcmp(argv[1], "shared-file") == 0) return shared_file();
    const int n = 100000;  // not a whole number of pages: the ranges end inside a page
    const size_t bytes = n * sizeof(unsigned);
    // Plain heap memory, as applications register it (the input one word into its allocation).
    auto* in_block = static_cast<unsigned*>(std::malloc(bytes + 64));
    auto* out = static_cast<unsigned*>(std::malloc(bytes));
    if (!in_block || !out) fail("malloc");
    unsigned* in = in_block + 1;
    for (int i = 0; i < n; ++i) in[i] = static_cast<unsigned>(i * 7 % 1000);
    in_block[0] = 0x12345678u;  // outside the registered range, on its first page
    std::memset(out, 0xab, bytes);

    CHECK(cudaFree(nullptr));  // a context first, as the driver requires for registration
    int read_only = 0;         // read-only registration is not offered on every system
    CHECK(cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, 0));
    cudaError_t e =
        cudaHostRegister(in, bytes, cudaHostRegisterMapped | (read_only ? cudaHostRegisterReadOnly : 0));
    if (e == cudaErrorNotSupported) {
        std::printf("mapped registered host memory not supported here: %s\n", cudaGetErrorName(e));
        return 3;
    }
    CHECK(e);
    CHECK(cudaHostRegister(out, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
    // The contents survive registration.
    if (in_block[0] != 0x12345678u) fail("the word before the registered range changed");
    for (int i = 0; i < n; ++i)
        if (in[i] != static_cast<unsigned>(i * 7 % 1000))
            fail("in[%d] changed by registration: %u", i, in[i]);
    for (int i = 0; i < n; ++i)
        if (out[i] != 0xababababu) fail("out[%d] changed by registration: %#x", i, out[i]);
    unsigned* d_in = nullptr;
    unsigned* d_out = nullptr;
    CHECK(cudaHostGetDevicePointer(&d_in, in, 0));
    CHECK(cudaHostGetDevicePointer(&d_out, out, 0));
    unsigned flags = 0;
    CHECK(cudaHostGetFlags(&flags, out));
    std::printf("registered and mapped: 2 buffers of %zu bytes\n", bytes);

    for (int round = 0; round < 3; ++round) {
        hr_times3_plus<<<(n + 255) / 256, 256>>>(d_in, d_out, n, static_cast<unsigned>(round));
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        for (int i = 0; i < n; ++i) {
            unsigned want = in[i] * 3u + static_cast<unsigned>(round);
            if (out[i] != want) fail("round %d: out[%d] = %u, want %u", round, i, out[i], want);
        }
        for (int i = 0; i < n; ++i) in[i] += 1;  // the next launch must see these host writes
    }
    unsigned long long sum = 0;
    for (int i = 0; i < n; ++i) sum += out[i];
    std::printf("kernel through registered host memory: 3 rounds ok, checksum %llu\n", sum);

    CHECK(cudaHostUnregister(in));
    CHECK(cudaHostUnregister(out));
    // Still the application's memory, contents kept.
    if (in_block[0] != 0x12345678u) fail("the word before the range changed by unregistration");
    for (int i = 0; i < n; ++i)
        if (out[i] != (in[i] - 1) * 3u + 2u) fail("out[%d] changed by unregistration: %u", i, out[i]);
    for (int i = 0; i < n; ++i) out[i] = static_cast<unsigned>(i);
    std::printf("unregistered: contents kept, memory writable\n");

    // Registered mapped again (the same pages a second time): the kernel reads what the host wrote since.
    CHECK(cudaHostRegister(out, bytes, cudaHostRegisterMapped));
    CHECK(cudaHostGetDevicePointer(&d_out, out, 0));
    hr_times3_plus<<<(n + 255) / 256, 256>>>(d_out, d_out, n, 9);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < n; ++i)
        if (out[i] != static_cast<unsigned>(i) * 3u + 9u) fail("registered again: out[%d] = %u", i, out[i]);
    CHECK(cudaHostUnregister(out));
    for (int i = 0; i < n; ++i) out[i] = static_cast<unsigned>(i);
    std::printf("registered mapped a second time: ok\n");

    // Default registration: copies from and into it.
    std::vector<unsigned> back(n);
    CHECK(cudaHostRegister(out, bytes, cudaHostRegisterDefault));
    unsigned* dev = nullptr;
    CHECK(cudaMalloc(&dev, bytes));
    CHECK(cudaMemcpy(dev, out, bytes, cudaMemcpyHostToDevice));
    hr_times3_plus<<<(n + 255) / 256, 256>>>(dev, dev, n, 5);
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpy(out, dev, bytes, cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i)
        if (out[i] != static_cast<unsigned>(i) * 3u + 5u)
            fail("copies through registered memory: out[%d] = %u", i, out[i]);
    if (cudaHostRegister(out, bytes, cudaHostRegisterDefault) != cudaErrorHostMemoryAlreadyRegistered)
        fail("registering the same range twice was not refused");
    cudaGetLastError();
    CHECK(cudaHostUnregister(out));
    if (cudaHostUnregister(out) != cudaErrorHostMemoryNotRegistered)
        fail("unregistering twice was not refused");
    cudaGetLastError();
    std::printf("copies from and into registered memory: ok\n");

    CHECK(cudaFree(dev));
    std::free(in_block);
    std::free(out);
    return pass();
}
