// shareable_handles: physical allocations shared between two processes through POSIX file descriptors, as the
// CUDA sample memMapIPCDrv does it. The parent creates two allocations that may be exported
// (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), fills them, exports each as a descriptor and passes them to a
// child (this program again) over a Unix socket (SCM_RIGHTS), closing its own copies as the sample does. The
// child imports them, maps them side by side in a reservation of its own, checks the parent's words, writes
// its own into both, unmaps and releases them; the parent then reads the child's words through its own
// mappings. Also: an allocation made without the handle type cannot be exported. Linked with -lcuda, no
// runtime.
#include <cuda.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "common.cuh"
#include "cu_check.h"

extern char** environ;

static const int chunks = 2;

// One message with `n` descriptors over a Unix socket, and its receipt.
static bool send_fds(int sock, const int* fds, int n) {
    char byte = 'h';
    iovec iov{&byte, 1};
    msghdr h{};
    h.msg_iov = &iov;
    h.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * chunks)] = {};
    h.msg_control = control;
    h.msg_controllen = CMSG_SPACE(sizeof(int) * n);
    cmsghdr* c = CMSG_FIRSTHDR(&h);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * n);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * n);
    return sendmsg(sock, &h, 0) == 1;
}

static int receive_fds(int sock, int* fds, int n) {
    char byte = 0;
    iovec iov{&byte, 1};
    msghdr h{};
    h.msg_iov = &iov;
    h.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * chunks)] = {};
    h.msg_control = control;
    h.msg_controllen = sizeof control;
    if (recvmsg(sock, &h, 0) != 1) return 0;
    cmsghdr* c = CMSG_FIRSTHDR(&h);
    if (!c || c->cmsg_type != SCM_RIGHTS) return 0;
    int got = static_cast<int>((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    if (got > n) got = n;
    std::memcpy(fds, CMSG_DATA(c), sizeof(int) * got);
    return got;
}

static unsigned parent_word(size_t k) { return static_cast<unsigned>(k * 2654435761u + 17); }
static unsigned child_word(size_t k) { return static_cast<unsigned>(k ^ 0x5a5a5a5au); }

static CUmemAllocationProp exportable_prop(CUdevice dev) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return prop;
}

// The child: the descriptors on the socket at fd 3; its verdict back on it ("ok" or what went wrong).
static int child() {
    CUcontext ctx;
    CUdevice dev = init_device0(&ctx);
    int fds[chunks] = {-1, -1};
    if (receive_fds(3, fds, chunks) != chunks) return 2;
    CUmemAllocationProp prop = exportable_prop(dev);
    size_t gran = 0;
    CU_CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    const size_t size = 2 * gran;
    CUdeviceptr base = 0;
    CU_CHECK(cuMemAddressReserve(&base, chunks * size, size, 0, 0));
    CUmemGenericAllocationHandle h[chunks];
    for (int i = 0; i < chunks; ++i) {
        CU_CHECK(cuMemImportFromShareableHandle(&h[i],
                                                reinterpret_cast<void*>(static_cast<uintptr_t>(fds[i])),
                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
        close(fds[i]);  // the imported handle holds the memory
        CU_CHECK(cuMemMap(base + i * size, size, 0, h[i], 0));
        CU_CHECK(cuMemRelease(h[i]));  // the mapping holds it now
    }
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CU_CHECK(cuMemSetAccess(base, chunks * size, &access, 1));
    const size_t words = chunks * size / 4;
    std::vector<unsigned> host(words);
    CU_CHECK(cuMemcpyDtoH(host.data(), base, words * 4));
    const char* verdict = "ok";
    for (size_t k = 0; k < words; ++k)
        if (host[k] != parent_word(k)) verdict = "the parent's words differ";
    for (size_t k = 0; k < words; ++k) host[k] = child_word(k);
    CU_CHECK(cuMemcpyHtoD(base, host.data(), words * 4));
    CU_CHECK(cuCtxSynchronize());
    CU_CHECK(cuMemUnmap(base, chunks * size));
    CU_CHECK(cuMemAddressFree(base, chunks * size));
    if (write(3, verdict, std::strlen(verdict)) < 0) return 2;
    return 0;
}

int main(int argc, char** argv) {
    if (argc > 1 && std::strcmp(argv[1], "child") == 0) return child();
    CUcontext ctx;
    CUdevice dev = init_device0(&ctx);
    int vmm = 0, posix = 0;
    CU_CHECK(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
    CU_CHECK(
        cuDeviceGetAttribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev));
    std::printf("virtual memory management %d, POSIX descriptor handles %d\n", vmm, posix);
    EXPECT(vmm && posix, "the device cannot share physical allocations by descriptor");

    CUmemAllocationProp prop = exportable_prop(dev);
    size_t gran = 0;
    CU_CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    const size_t size = 2 * gran;
    CUdeviceptr base = 0;
    CU_CHECK(cuMemAddressReserve(&base, chunks * size, size, 0, 0));
    CUmemGenericAllocationHandle h[chunks];
    int fds[chunks];
    for (int i = 0; i < chunks; ++i) {
        CU_CHECK(cuMemCreate(&h[i], size, &prop, 0));
        CU_CHECK(cuMemMap(base + i * size, size, 0, h[i], 0));
        CU_CHECK(cuMemExportToShareableHandle(&fds[i], h[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    }
    CUmemAccessDesc access{};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CU_CHECK(cuMemSetAccess(base, chunks * size, &access, 1));
    const size_t words = chunks * size / 4;
    std::vector<unsigned> host(words);
    for (size_t k = 0; k < words; ++k) host[k] = parent_word(k);
    CU_CHECK(cuMemcpyHtoD(base, host.data(), words * 4));
    CU_CHECK(cuCtxSynchronize());
    std::printf("%d allocations of %zu KiB exported as descriptors\n", chunks, size >> 10);

    // Not exportable without the handle type.
    CUmemAllocationProp plain = prop;
    plain.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    CUmemGenericAllocationHandle p;
    CU_CHECK(cuMemCreate(&p, gran, &plain, 0));
    int none = -1;
    CUresult r = cuMemExportToShareableHandle(&none, p, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    EXPECT(r != CUDA_SUCCESS, "an allocation made without the handle type was exported");
    std::printf("an allocation made without the handle type is not exported\n");
    CU_CHECK(cuMemRelease(p));

    int sv[2];
    EXPECT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "no socket pair");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, sv[1], 3);
    posix_spawn_file_actions_addclose(&fa, sv[0]);
    char self[] = "/proc/self/exe", child_arg[] = "child";
    char* args[] = {argv[0], child_arg, nullptr};
    pid_t pid = -1;
    EXPECT(posix_spawn(&pid, self, &fa, nullptr, args, environ) == 0, "cannot start the child");
    posix_spawn_file_actions_destroy(&fa);
    close(sv[1]);
    EXPECT(send_fds(sv[0], fds, chunks), "cannot pass the descriptors");
    for (int fd : fds) close(fd);  // the child has its own now
    char verdict[64] = {};
    ssize_t got = read(sv[0], verdict, sizeof verdict - 1);
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT(got > 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child failed (status %d)", status);
    std::printf("child: %s\n", verdict);
    EXPECT(std::strcmp(verdict, "ok") == 0, "the child saw other words");

    CU_CHECK(cuMemcpyDtoH(host.data(), base, words * 4));
    for (size_t k = 0; k < words; ++k)
        if (host[k] != child_word(k)) fail("word %zu = %#x after the child wrote it", k, host[k]);
    std::printf("the child's words, read through our own mappings: ok\n");
    CU_CHECK(cuMemUnmap(base, chunks * size));
    for (auto x : h) CU_CHECK(cuMemRelease(x));
    CU_CHECK(cuMemAddressFree(base, chunks * size));
    close(sv[0]);
    return pass();
}
