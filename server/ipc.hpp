// Sharing between sessions of one server: legacy IPC memory and event handles (cuIpcGetMemHandle,
// cuIpcGetEventHandle), shareable handles of physical allocations (cuMemExportToShareableHandle). An export
// is a capability: 128 random bits from the OS CSPRNG (the token), kept in a registry with the exporter's
// tenant, the exporting session and what the importer needs — a descriptor of the physical memory, the
// driver's own handle, or (thread mode) an object of this process. Only a session of the same tenant opens
// it; a handle another server made, or an unknown token, is refused with the reason. What the application
// holds is 64 opaque bytes (ipc_handle): a magic, the kind, this server's instance id and the token.
//
// Where the registry lives: in the server process with --isolation thread (every session is there), in the
// parent with --isolation process, which its workers ask over their control socket; a session reaches it
// through an ipc_broker either way.
// locks: the registry has a mutex of its own; brokers hold nothing across calls.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace vcuda::server {

inline constexpr size_t ipc_token_bytes = 16;
using ipc_token = std::array<std::byte, ipc_token_bytes>;
ipc_token new_ipc_token();                       // from the OS CSPRNG
std::string ipc_token_text(const ipc_token& t);  // its first 4 bytes in hex, for logs

enum class ipc_kind : uint8_t { memory = 1, event = 2, allocation = 3, pool = 4, pool_pointer = 5 };

// The 64 bytes the application holds: "vcIPC" 0x01, the kind, a zero byte, the server's instance id (8
// bytes), the token (16 bytes), zeros.
inline constexpr size_t ipc_handle_bytes = 64;
struct ipc_handle {
    ipc_kind kind = ipc_kind::memory;
    uint64_t instance = 0;
    ipc_token token{};
};
std::array<std::byte, ipc_handle_bytes> encode_ipc_handle(const ipc_handle& h);
// False when `b` is not 64 bytes of that form.
bool decode_ipc_handle(std::span<const std::byte> b, ipc_handle& out);

// A descriptor that closes itself.
class unique_fd {
  public:
    unique_fd() = default;
    explicit unique_fd(int fd) : fd_(fd) {}
    unique_fd(unique_fd&& o) noexcept : fd_(o.release()) {}
    unique_fd& operator=(unique_fd&& o) noexcept;
    unique_fd(const unique_fd&) = delete;
    unique_fd& operator=(const unique_fd&) = delete;
    ~unique_fd();
    int get() const { return fd_; }
    int release() {
        int f = fd_;
        fd_ = -1;
        return f;
    }
    unique_fd dup() const;  // -1 inside when there is none or dup fails

  private:
    int fd_ = -1;
};

// What an export makes openable.
struct ipc_export {
    ipc_kind kind = ipc_kind::memory;
    uint64_t owner = 0;           // the exporting session (filled by fetch)
    std::vector<std::byte> meta;  // the kind's description (handlers_ipc.cpp)
    unique_fd fd;                 // the physical memory's descriptor; none for events
};

// Every live export of the sessions it serves. Sessions are named by id; a tenant is what server.cpp derived
// from the session's credential (session_grant::tenant).
class ipc_registry {
  public:
    void put(const ipc_token& t, uint64_t owner, const std::string& tenant, ipc_export e);
    // A copy of export `t` (its descriptor duplicated) when `tenant` is its tenant; false when there is no
    // such export, and also for a token of another tenant (logged, with the session `who` that asked).
    bool fetch(const ipc_token& t, uint64_t who, const std::string& tenant, ipc_export& out);
    void withdraw(const ipc_token& t, uint64_t owner);
    void drop_owner(uint64_t owner);
    size_t size();

  private:
    struct entry {
        uint64_t owner = 0;
        std::string tenant;
        ipc_export e;
    };
    std::mutex mu_;
    std::map<ipc_token, entry> entries_;
};

// How a session reaches the registry.
class ipc_broker {
  public:
    explicit ipc_broker(uint64_t instance) : instance_(instance) {}
    virtual ~ipc_broker() = default;
    uint64_t instance() const { return instance_; }
    // Every session of this server is in this process (--isolation thread): in-process objects may be shared.
    virtual bool in_process() const = 0;
    virtual bool deposit(const ipc_token& t, uint64_t owner, const std::string& tenant, ipc_export e,
                         std::string& why) = 0;
    virtual void withdraw(const ipc_token& t, uint64_t owner) = 0;
    virtual bool fetch(const ipc_token& t, uint64_t who, const std::string& tenant, ipc_export& out,
                       std::string& why) = 0;
    virtual void drop_owner(uint64_t owner) = 0;

  private:
    uint64_t instance_;
};

// --isolation thread: the registry in this process.
std::shared_ptr<ipc_broker> make_local_broker(uint64_t instance, std::shared_ptr<ipc_registry> registry);
// A worker (--isolation process): requests to the parent over `control_fd`, each answered on a socket pair
// of its own that rides along. The parent knows the worker's session and tenant: those a worker sends are
// not used.
std::shared_ptr<ipc_broker> make_worker_broker(uint64_t instance, int control_fd);

// The parent's side: one request a worker sent (`m`, with its descriptors), served from `registry` for the
// worker's session `owner` of `tenant`. True when `m` was an IPC request.
bool serve_ipc_request(ipc_registry& registry, uint64_t owner, const std::string& tenant,
                       std::span<const std::byte> m, std::vector<int>& fds);

}  // namespace vcuda::server
