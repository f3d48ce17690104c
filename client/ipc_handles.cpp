#include "client/ipc_handles.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>

#include "common/log.hpp"

namespace vcuda::client {

namespace {
constexpr char magic[8] = {'v', 'c', 'u', 'd', 'a', 'S', 'H', '1'};
}  // namespace

int shareable_descriptor(const ipc_bytes& handle) {
    int fd = ::memfd_create("vcuda-shareable-handle", MFD_ALLOW_SEALING);
    if (fd < 0) return -1;
    char buf[sizeof magic + ipc_handle_bytes];
    std::memcpy(buf, magic, sizeof magic);
    std::memcpy(buf + sizeof magic, handle.data(), handle.size());
    if (::pwrite(fd, buf, sizeof buf, 0) != static_cast<ssize_t>(sizeof buf) ||
        ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
        int e = errno;
        ::close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

bool read_shareable_descriptor(int fd, ipc_bytes& out) {
    char buf[sizeof magic + ipc_handle_bytes + 1];
    ssize_t n = ::pread(fd, buf, sizeof buf, 0);
    if (n != static_cast<ssize_t>(sizeof magic + ipc_handle_bytes) ||
        std::memcmp(buf, magic, sizeof magic) != 0)
        return false;
    std::memcpy(out.data(), buf + sizeof magic, out.size());
    return true;
}

void log_ipc_refusal(const char* call, int result, const std::string& detail) {
    static std::mutex mu;
    static auto* seen = new std::set<std::string>();
    std::string key =
        std::string(call) + ": " + (detail.empty() ? "error " + std::to_string(result) : detail);
    std::lock_guard lock(mu);
    if (!seen->insert(key).second) return;
    if (detail.empty())  // the driver's own answer, as the application gets it natively
        VCUDA_LOG_DEBUG("{} (result {})", key, result);
    else
        VCUDA_LOG_WARN("{} (result {})", key, result);
}

CUresult refused_by_server(const char* call, CUresult rc, const plain_call& c) {
    log_ipc_refusal(call, rc, c.reply().detail);
    return rc;
}

CUresult export_descriptor(plain_call& c, const char* call, void* fd_out) {
    if (CUresult rc = c.send_sync(); rc != CUDA_SUCCESS) return refused_by_server(call, rc, c);
    const auto& blobs = c.reply().blobs;
    ipc_bytes bytes;
    if (blobs.size() != 1 || blobs[0].size() != bytes.size()) return CUDA_ERROR_UNKNOWN;
    std::memcpy(bytes.data(), blobs[0].data(), bytes.size());
    int fd = shareable_descriptor(bytes);
    if (fd < 0) return CUDA_ERROR_OPERATING_SYSTEM;
    *static_cast<int*>(fd_out) = fd;
    return CUDA_SUCCESS;
}

bool handle_in_descriptor(void* os_handle, const char* call, ipc_bytes& out) {
    if (read_shareable_descriptor(static_cast<int>(reinterpret_cast<intptr_t>(os_handle)), out)) return true;
    log_ipc_refusal(call, CUDA_ERROR_INVALID_VALUE, "the descriptor is not one vcuda's export made");
    return false;
}

}  // namespace vcuda::client
