// pool_ipc: a memory pool shared between two processes, as NVIDIA's streamOrderedAllocationIPC does. The
// parent makes a pool for POSIX file descriptors, allocates from it on a stream and fills the memory, exports
// the pool (cudaMemPoolExportToShareableHandle) and the allocation (cudaMemPoolExportPointer), and passes the
// descriptor and the export data to a child over a Unix socket. The child imports both, changes the memory in
// a kernel, frees its import in stream order and reports; the parent checks every word. Both processes fork
// before CUDA starts, so through vcuda each is a session of its own on the same server.
#include <cuda_runtime.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "common.cuh"

extern "C" __global__ void mp_fill(int* p, int n, int v) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v + i;
}

extern "C" __global__ void mm_square_plus(const unsigned* in, unsigned* out, int n, unsigned k) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * in[i] + k;
}

namespace {

constexpr int n = 1 << 16;
constexpr int threads = 256, blocks = (n + threads - 1) / threads;

// One message: the pool's descriptor (SCM_RIGHTS) and the allocation's export data, as sent and received.
struct export_message {
    iovec iov;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr m{};
    explicit export_message(cudaMemPoolPtrExportData& data) : iov{&data, sizeof data} {
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = control;
        m.msg_controllen = sizeof control;
    }
};

bool send_export(int sock, int fd, const cudaMemPoolPtrExportData& data) {
    export_message e(const_cast<cudaMemPoolPtrExportData&>(data));
    cmsghdr* c = CMSG_FIRSTHDR(&e.m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
    return sendmsg(sock, &e.m, 0) == static_cast<ssize_t>(sizeof data);
}

bool receive_export(int sock, int& fd, cudaMemPoolPtrExportData& data) {
    export_message e(data);
    if (recvmsg(sock, &e.m, MSG_WAITALL) != static_cast<ssize_t>(sizeof data)) return false;
    cmsghdr* c = CMSG_FIRSTHDR(&e.m);
    if (!c || c->cmsg_type != SCM_RIGHTS) return false;
    std::memcpy(&fd, CMSG_DATA(c), sizeof fd);
    return true;
}

int child(int sock) {
    int fd = -1;
    cudaMemPoolPtrExportData data;
    if (!receive_export(sock, fd, data)) fail("child: no export arrived");
    CHECK(cudaSetDevice(0));
    cudaMemPool_t pool;
    CHECK(cudaMemPoolImportFromShareableHandle(&pool, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                               cudaMemHandleTypePosixFileDescriptor, 0));
    unsigned* p = nullptr;
    CHECK(cudaMemPoolImportPointer(reinterpret_cast<void**>(&p), pool, &data));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    mm_square_plus<<<blocks, threads, 0, s>>>(p, p, n, 3);
    CHECK(cudaGetLastError());
    CHECK(cudaFreeAsync(p, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaMemPoolDestroy(pool));
    close(fd);
    const char done = 1;
    if (write(sock, &done, 1) != 1) fail("child: could not report");
    return 0;
}

}  // namespace

int main() {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) fail("socketpair");
    const pid_t pid = fork();
    if (pid < 0) fail("fork");
    if (pid == 0) {
        close(sv[0]);
        return child(sv[1]);
    }
    close(sv[1]);
    CHECK(cudaSetDevice(0));
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    cudaMemPool_t pool;
    CHECK(cudaMemPoolCreate(&pool, &props));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    int* d = nullptr;
    CHECK(cudaMallocFromPoolAsync(reinterpret_cast<void**>(&d), n * sizeof(int), pool, s));
    mp_fill<<<blocks, threads, 0, s>>>(d, n, 5);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(s));
    int fd = -1;
    CHECK(cudaMemPoolExportToShareableHandle(&fd, pool, cudaMemHandleTypePosixFileDescriptor, 0));
    cudaMemPoolPtrExportData data;
    CHECK(cudaMemPoolExportPointer(&data, d));
    if (!send_export(sv[0], fd, data)) fail("could not send the export to the child");
    std::printf("pool and allocation exported to another process\n");
    char done = 0;
    if (read(sv[0], &done, 1) != 1 || done != 1) fail("the child did not report");
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) fail("the child failed (status %d)", status);
    std::vector<unsigned> back(n);
    CHECK(cudaMemcpy(back.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
    for (int i = 0; i < n; ++i) {
        const unsigned v = 5u + static_cast<unsigned>(i);
        if (back[i] != v * v + 3u) fail("word %d = %u, want %u", i, back[i], v * v + 3u);
    }
    std::printf("the other process's kernel changed the pool's memory: %d words ok\n", n);
    CHECK(cudaFreeAsync(d, s));
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaStreamDestroy(s));
    CHECK(cudaMemPoolDestroy(pool));
    close(fd);
    return pass();
}
