// Datagrams on the SOCK_SEQPACKET socket pairs between the server and its worker processes (--isolation
// process, server/isolation.cpp) and on the sockets a worker's IPC requests carry for their answers
// (server/ipc.cpp): fields in host byte order (both ends are the same binary), descriptors riding along with
// SCM_RIGHTS. runs on: any thread (no shared state; one datagram per call, so threads may share a socket).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace vcuda::server {

struct message_writer {
    std::vector<std::byte> bytes;
    void u32(uint32_t v) { raw(&v, sizeof v); }
    void u64(uint64_t v) { raw(&v, sizeof v); }
    void str(std::string_view s) {
        u32(static_cast<uint32_t>(s.size()));
        raw(s.data(), s.size());
    }
    void raw(const void* p, size_t n) {
        const auto* b = static_cast<const std::byte*>(p);
        bytes.insert(bytes.end(), b, b + n);
    }
};

// Reads fields in order; `ok` turns false at the first field past the end, and every later read gives zeros.
struct message_reader {
    std::span<const std::byte> bytes;
    bool ok = true;
    void raw(void* p, size_t n) {
        if (!ok || bytes.size() < n) {
            ok = false;
            return;
        }
        std::memcpy(p, bytes.data(), n);
        bytes = bytes.subspan(n);
    }
    uint32_t u32() {
        uint32_t v = 0;
        raw(&v, sizeof v);
        return v;
    }
    uint64_t u64() {
        uint64_t v = 0;
        raw(&v, sizeof v);
        return v;
    }
    std::string str() {
        uint32_t n = u32();
        if (!ok || bytes.size() < n) {
            ok = false;
            return {};
        }
        std::string s(reinterpret_cast<const char*>(bytes.data()), n);
        bytes = bytes.subspan(n);
        return s;
    }
};

// The largest datagram receive_message takes.
inline constexpr size_t max_message_bytes = (128u << 10) + 8192;  // a HELLO and the bytes read after it

// One datagram with `fds` (at most 4) passed along. False when the peer is gone.
bool send_message(int sock, const std::vector<std::byte>& m, std::span<const int> fds = {});
inline bool send_message(int sock, const std::vector<std::byte>& m, int fd) {
    return fd >= 0 ? send_message(sock, m, std::span<const int>(&fd, 1)) : send_message(sock, m);
}
// One datagram into `m` and the descriptors that came with it (close-on-exec; the caller owns them; past
// `max_fds` they are closed). 1: a datagram; 0: the peer closed; -1: an error.
int receive_message(int sock, std::vector<std::byte>& m, std::vector<int>& fds, size_t max_fds = 4);
// The same for at most one descriptor (-1 when none came).
int receive_message(int sock, std::vector<std::byte>& m, int& fd);
// A worker's request to its parent on `control`: sends `m` with a socket for the answer (and `fd`, when >= 0)
// and waits up to 10 s for the answer (into `reply`, with at most one descriptor into `fds`); false, with
// `why`, when the parent is gone or did not answer.
bool ask_parent(int control, const std::vector<std::byte>& m, int fd, std::vector<std::byte>& reply,
                std::vector<int>& fds, std::string& why);

}  // namespace vcuda::server
