#include "server/ipc.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "common/log.hpp"
#include "common/random.hpp"
#include "server/control_messages.hpp"

namespace vcuda::server {

namespace {

constexpr char magic[6] = {'v', 'c', 'I', 'P', 'C', 1};

// Requests a worker sends its parent (after isolation.cpp's session and connection messages, 1 and 2).
constexpr uint32_t msg_ipc_deposit = 10, msg_ipc_withdraw = 11, msg_ipc_fetch = 12;

bool known_kind(uint32_t k) { return k >= 1 && k <= 5; }

}  // namespace

ipc_token new_ipc_token() {
    ipc_token t;
    std::string b = os_random_bytes(t.size());
    std::memcpy(t.data(), b.data(), t.size());
    return t;
}

std::string ipc_token_text(const ipc_token& t) {
    char s[9];
    std::snprintf(s, sizeof s, "%02x%02x%02x%02x", unsigned(t[0]), unsigned(t[1]), unsigned(t[2]),
                  unsigned(t[3]));
    return s;
}

std::array<std::byte, ipc_handle_bytes> encode_ipc_handle(const ipc_handle& h) {
    std::array<std::byte, ipc_handle_bytes> b{};
    std::memcpy(b.data(), magic, sizeof magic);
    b[6] = static_cast<std::byte>(h.kind);
    std::memcpy(b.data() + 8, &h.instance, sizeof h.instance);
    std::memcpy(b.data() + 16, h.token.data(), h.token.size());
    return b;
}

bool decode_ipc_handle(std::span<const std::byte> b, ipc_handle& out) {
    if (b.size() != ipc_handle_bytes || std::memcmp(b.data(), magic, sizeof magic) != 0 ||
        b[7] != std::byte{0} || !known_kind(static_cast<uint32_t>(b[6])))
        return false;
    for (size_t i = 32; i < b.size(); ++i)
        if (b[i] != std::byte{0}) return false;
    out.kind = static_cast<ipc_kind>(b[6]);
    std::memcpy(&out.instance, b.data() + 8, sizeof out.instance);
    std::memcpy(out.token.data(), b.data() + 16, out.token.size());
    return true;
}

// ---------------------------------------------------------------- descriptors

unique_fd& unique_fd::operator=(unique_fd&& o) noexcept {
    if (this != &o) {
        if (fd_ >= 0) ::close(fd_);
        fd_ = o.release();
    }
    return *this;
}

unique_fd::~unique_fd() {
    if (fd_ >= 0) ::close(fd_);
}

unique_fd unique_fd::dup() const { return unique_fd(fd_ >= 0 ? ::fcntl(fd_, F_DUPFD_CLOEXEC, 0) : -1); }

// ---------------------------------------------------------------- registry

void ipc_registry::put(const ipc_token& t, uint64_t owner, const std::string& tenant, ipc_export e) {
    std::lock_guard lock(mu_);
    entries_[t] = entry{owner, tenant, std::move(e)};
}

bool ipc_registry::fetch(const ipc_token& t, uint64_t who, const std::string& tenant, ipc_export& out) {
    std::lock_guard lock(mu_);
    auto it = entries_.find(t);
    if (it == entries_.end()) return false;
    if (it->second.tenant != tenant) {
        VCUDA_LOG_WARN(
            "session {} presented an IPC handle ({}...) that session {} of another tenant made: refused "
            "as unknown",
            who, ipc_token_text(t), it->second.owner);
        return false;
    }
    const ipc_export& e = it->second.e;
    out.kind = e.kind;
    out.owner = it->second.owner;
    out.meta = e.meta;
    out.fd = e.fd.dup();
    return true;
}

void ipc_registry::withdraw(const ipc_token& t, uint64_t owner) {
    std::lock_guard lock(mu_);
    if (auto it = entries_.find(t); it != entries_.end() && it->second.owner == owner) entries_.erase(it);
}

void ipc_registry::drop_owner(uint64_t owner) {
    std::lock_guard lock(mu_);
    std::erase_if(entries_, [&](const auto& kv) { return kv.second.owner == owner; });
}

size_t ipc_registry::size() {
    std::lock_guard lock(mu_);
    return entries_.size();
}

// ---------------------------------------------------------------- brokers

namespace {

class local_broker final : public ipc_broker {
  public:
    local_broker(uint64_t instance, std::shared_ptr<ipc_registry> r)
        : ipc_broker(instance), r_(std::move(r)) {}
    bool in_process() const override { return true; }
    bool deposit(const ipc_token& t, uint64_t owner, const std::string& tenant, ipc_export e,
                 std::string&) override {
        r_->put(t, owner, tenant, std::move(e));
        return true;
    }
    void withdraw(const ipc_token& t, uint64_t owner) override { r_->withdraw(t, owner); }
    bool fetch(const ipc_token& t, uint64_t who, const std::string& tenant, ipc_export& out,
               std::string&) override {
        return r_->fetch(t, who, tenant, out);
    }
    void drop_owner(uint64_t owner) override { r_->drop_owner(owner); }

  private:
    std::shared_ptr<ipc_registry> r_;
};

class worker_broker final : public ipc_broker {
  public:
    worker_broker(uint64_t instance, int control) : ipc_broker(instance), control_(control) {}
    bool in_process() const override { return false; }

    bool deposit(const ipc_token& t, uint64_t, const std::string&, ipc_export e, std::string& why) override {
        message_writer m;
        m.u32(msg_ipc_deposit);
        m.raw(t.data(), t.size());
        m.u32(static_cast<uint32_t>(e.kind));
        m.str(std::string_view(reinterpret_cast<const char*>(e.meta.data()), e.meta.size()));
        std::vector<std::byte> reply;
        std::vector<int> fds;
        if (!ask(m, e.fd.get(), reply, fds, why)) return false;
        message_reader r{reply};
        uint32_t status = r.u32();
        if (!r.ok || status != 0) {
            why = "the server refused the export";
            return false;
        }
        return true;
    }

    // Answered: once the call that freed the object returns, no other session can open its handle (an
    // unanswered message raced with other workers' fetches on their own control sockets).
    void withdraw(const ipc_token& t, uint64_t) override {
        message_writer m;
        m.u32(msg_ipc_withdraw);
        m.raw(t.data(), t.size());
        std::vector<std::byte> reply;
        std::vector<int> fds;
        std::string why;
        if (!ask(m, -1, reply, fds, why)) VCUDA_LOG_WARN("IPC handle withdrawal not confirmed: {}", why);
        for (int fd : fds) ::close(fd);
    }

    bool fetch(const ipc_token& t, uint64_t, const std::string&, ipc_export& out, std::string& why) override {
        message_writer m;
        m.u32(msg_ipc_fetch);
        m.raw(t.data(), t.size());
        std::vector<std::byte> reply;
        std::vector<int> fds;
        if (!ask(m, -1, reply, fds, why)) return false;
        unique_fd fd(fds.empty() ? -1 : fds.front());
        message_reader r{reply};
        uint32_t found = r.u32(), kind = r.u32();
        uint64_t owner = r.u64();
        std::string meta = r.str();
        if (!r.ok || found > 1 || (found && !known_kind(kind))) {
            why = "a malformed answer from the server";
            return false;
        }
        if (!found) return false;
        out.kind = static_cast<ipc_kind>(kind);
        out.owner = owner;
        out.meta.assign(reinterpret_cast<const std::byte*>(meta.data()),
                        reinterpret_cast<const std::byte*>(meta.data()) + meta.size());
        out.fd = std::move(fd);
        return true;
    }

    // The parent drops a worker's exports when the worker ends (its session ended first).
    void drop_owner(uint64_t) override {}

  private:
    bool ask(const message_writer& m, int fd, std::vector<std::byte>& reply, std::vector<int>& fds,
             std::string& why) {
        return ask_parent(control_, m.bytes, fd, reply, fds, why);
    }

    int control_;
};

}  // namespace

std::shared_ptr<ipc_broker> make_local_broker(uint64_t instance, std::shared_ptr<ipc_registry> registry) {
    return std::make_shared<local_broker>(instance, std::move(registry));
}

std::shared_ptr<ipc_broker> make_worker_broker(uint64_t instance, int control_fd) {
    return std::make_shared<worker_broker>(instance, control_fd);
}

bool serve_ipc_request(ipc_registry& registry, uint64_t owner, const std::string& tenant,
                       std::span<const std::byte> m, std::vector<int>& fds) {
    message_reader r{m};
    uint32_t type = r.u32();
    if (type != msg_ipc_deposit && type != msg_ipc_withdraw && type != msg_ipc_fetch) return false;
    ipc_token t{};
    r.raw(t.data(), t.size());
    // The descriptors: the answer's socket first, then a deposit's memory.
    unique_fd answer(!fds.empty() ? fds[0] : -1);
    unique_fd memory(type == msg_ipc_deposit && fds.size() > 1 ? fds[1] : -1);
    for (size_t i = type == msg_ipc_deposit ? 2 : 1; i < fds.size(); ++i) ::close(fds[i]);
    fds.clear();
    message_writer reply;
    if (type == msg_ipc_withdraw) {
        if (r.ok) registry.withdraw(t, owner);
        reply.u32(0);
        if (answer.get() >= 0) send_message(answer.get(), reply.bytes);
        return true;
    }
    if (type == msg_ipc_deposit) {
        uint32_t kind = r.u32();
        std::string meta = r.str();
        bool ok = r.ok && known_kind(kind);
        if (ok) {
            ipc_export e;
            e.kind = static_cast<ipc_kind>(kind);
            e.meta.assign(reinterpret_cast<const std::byte*>(meta.data()),
                          reinterpret_cast<const std::byte*>(meta.data()) + meta.size());
            e.fd = std::move(memory);
            registry.put(t, owner, tenant, std::move(e));
        }
        reply.u32(ok ? 0 : 1);
        if (answer.get() >= 0) send_message(answer.get(), reply.bytes);
        return true;
    }
    ipc_export e;
    const bool found = r.ok && registry.fetch(t, owner, tenant, e);
    reply.u32(found ? 1 : 0);
    reply.u32(static_cast<uint32_t>(e.kind));
    reply.u64(e.owner);
    reply.str(std::string_view(reinterpret_cast<const char*>(e.meta.data()), e.meta.size()));
    if (answer.get() >= 0) send_message(answer.get(), reply.bytes, e.fd.get());
    return true;
}

}  // namespace vcuda::server
