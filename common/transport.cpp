#include "common/transport.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "common/log.hpp"
#include "common/tls.hpp"

namespace vcuda {

namespace asio = boost::asio;
using error_code = boost::system::error_code;

std::string_view to_string(transport_errc e) {
    switch (e) {
        case transport_errc::peer_lost:
            return "peer lost";
        case transport_errc::closed:
            return "connection closed";
        case transport_errc::timeout:
            return "timed out";
        case transport_errc::refused:
            return "connection refused";
        case transport_errc::bad_address:
            return "bad address";
        case transport_errc::io:
            return "i/o error";
        case transport_errc::protocol:
            return "protocol error";
    }
    return "unknown";
}

// ---------------------------------------------------------------- endpoint

result<endpoint, std::string> endpoint::parse(std::string_view text) {
    endpoint ep;
    if (text.starts_with("unix:")) {
        text.remove_prefix(5);
        while (text.starts_with("//")) text.remove_prefix(1);
        if (text.empty())
            return unexpected{std::string("unix: needs a socket path, e.g. unix:/run/vcuda.sock")};
        if (text.size() >= sizeof(sockaddr_un::sun_path))
            return unexpected{std::string("unix socket path too long (max 107 bytes)")};
        ep.type = kind::unix_socket;
        ep.path = std::string(text);
        return ep;
    }
    if (text.starts_with("tcp://")) text.remove_prefix(6);
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos || colon + 1 == text.size())
        return unexpected{"'" + std::string(text) + "' has no port; write host:port, e.g. 127.0.0.1:7300"};
    std::string_view host = text.substr(0, colon), port = text.substr(colon + 1);
    if (host.starts_with('[') && host.ends_with(']')) host = host.substr(1, host.size() - 2);
    unsigned value = 0;
    auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (ec != std::errc() || p != port.data() + port.size() || value > 65535)
        return unexpected{"'" + std::string(port) + "' is not a port number (0-65535)"};
    ep.type = kind::tcp;
    ep.host = host.empty() ? "0.0.0.0" : std::string(host);
    ep.port = static_cast<uint16_t>(value);
    return ep;
}

std::string endpoint::to_string() const {
    if (type == kind::unix_socket) return "unix:" + path;
    if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
    return host + ":" + std::to_string(port);
}

bool is_loopback(const std::string& host) {
    in_addr a4{};
    in6_addr a6{};
    if (inet_pton(AF_INET, host.c_str(), &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host.c_str(), &a6) == 1) {
        if (IN6_IS_ADDR_LOOPBACK(&a6)) return true;
        return IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127;
    }
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* list = nullptr;
    if (getaddrinfo(host.c_str(), nullptr, &hints, &list) != 0 || !list) return false;
    bool all = true;
    for (addrinfo* ai = list; ai; ai = ai->ai_next) {
        char text[INET6_ADDRSTRLEN] = {};
        if (ai->ai_family == AF_INET)
            inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_addr, text, sizeof text);
        else if (ai->ai_family == AF_INET6)
            inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_addr, text, sizeof text);
        if (!*text || !is_loopback(text)) all = false;
    }
    freeaddrinfo(list);
    return all;
}

// ---------------------------------------------------------------- stream

namespace {

void tune_socket(int fd, bool tcp) {
    int one = 1;
    if (tcp) {
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // small calls must not wait for Nagle
        setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);  // notice hosts that vanish
    }
    int buf = 8 << 20;  // large buffers keep bulk copies streaming
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

int poll_timeout_ms(deadline until) {
    if (!until) return -1;
    auto left = *until - clock::now();
    if (left <= clock::duration::zero()) return 0;
    // Rounded up: a wait never gives up before its deadline (truncating made the last millisecond a poll(0)).
    return static_cast<int>(
        std::min<long long>(std::chrono::ceil<std::chrono::milliseconds>(left).count(), INT_MAX));
}

std::string errno_text(int e) { return std::strerror(e); }

// The descriptor of an Asio socket that is done with Asio (the caller owns it), close-on-exec.
template <class Socket>
transport_result<int> release_descriptor(Socket& sock) {
    error_code ec;
    int fd = sock.release(ec);
    if (ec) return unexpected{transport_error{transport_errc::io, ec.message()}};
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    return fd;
}

// Connects `sock` to `to` within `timeout` (Asio: the connect and a deadline on one io_context); the socket's
// descriptor, close-on-exec, then belongs to the caller.
template <class Socket, class Endpoint>
transport_result<int> connect_within(asio::io_context& io, Socket& sock, const Endpoint& to,
                                     std::chrono::milliseconds timeout) {
    error_code result = asio::error::would_block;
    sock.async_connect(to, [&](const error_code& ec) { result = ec; });
    io.restart();
    io.run_for(timeout);
    if (result == asio::error::would_block) {  // still connecting at the deadline: cancelled
        error_code ignored;
        sock.close(ignored);
        io.restart();
        io.run();
        return unexpected{transport_error{transport_errc::timeout,
                                          "no answer within " + std::to_string(timeout.count()) + " ms"}};
    }
    if (result) {
        const bool refused = result == asio::error::connection_refused || result == asio::error::not_found ||
                             result == boost::system::errc::no_such_file_or_directory;
        error_code ignored;
        sock.close(ignored);
        return unexpected{
            transport_error{refused ? transport_errc::refused : transport_errc::io, result.message()}};
    }
    return release_descriptor(sock);
}

}  // namespace

namespace {
bool is_unix_socket(int fd) {
    sockaddr_storage sa{};
    socklen_t len = sizeof sa;
    return fd >= 0 && ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0 &&
           sa.ss_family == AF_UNIX;
}
}  // namespace

stream::stream() = default;
stream::stream(int fd) : fd_(fd), local_(is_unix_socket(fd)) {}
stream::stream(stream&& o) noexcept
    : fd_(o.fd_),
      local_(o.local_),
      rbuf_(std::move(o.rbuf_)),
      rpos_(o.rpos_),
      rlen_(o.rlen_),
      rings_(std::move(o.rings_)),
      spin_(o.spin_),
      fds_received_(o.fds_received_),
      lost_(o.lost_.load()),
      reported_(o.reported_.load()),
      peer_(std::move(o.peer_)),
      received_fds_(std::move(o.received_fds_)),
      tls_(std::move(o.tls_)),
      wbuf_(std::move(o.wbuf_)) {
    o.fd_ = -1;
}
stream& stream::operator=(stream&& o) noexcept {
    if (this != &o) {
        tls_.reset();  // before its socket closes
        if (fd_ >= 0) ::close(fd_);
        close_received();
        fd_ = o.fd_;
        local_ = o.local_;
        rbuf_ = std::move(o.rbuf_);
        rpos_ = o.rpos_;
        rlen_ = o.rlen_;
        rings_ = std::move(o.rings_);
        spin_ = o.spin_;
        fds_received_ = o.fds_received_;
        received_fds_ = std::move(o.received_fds_);
        o.fd_ = -1;
        lost_ = o.lost_.load();
        reported_ = o.reported_.load();
        peer_ = std::move(o.peer_);
        tls_ = std::move(o.tls_);
        wbuf_ = std::move(o.wbuf_);
    }
    return *this;
}
stream::~stream() {
    tls_.reset();
    if (fd_ >= 0) ::close(fd_);
    close_received();
}

void stream::close_received() {
    for (int fd : received_fds_) ::close(fd);
    received_fds_.clear();
}

int stream::take_fd() {
    // On rings a descriptor goes out on the socket before its frame's bytes enter the ring: if the peer
    // counted more than arrived, it is in the socket already or about to be.
    if (received_fds_.empty() && rings_ &&
        rings_->inbound().control().fds_sent.load(std::memory_order_acquire) > fds_received_) {
        deadline until = after(std::chrono::seconds(10));
        while (received_fds_.empty() && !lost_) {
            if (!wait(POLLIN, until) || !drain_socket()) break;
        }
    }
    if (received_fds_.empty()) return -1;
    int fd = received_fds_.front();
    received_fds_.pop_front();
    return fd;
}

transport_result<stream> stream::connect(const endpoint& ep, std::chrono::milliseconds timeout) {
    if (ep.type == endpoint::kind::unix_socket) return connect(ep, timeout, nullptr);
    auto tls = tls_context::from_environment();
    if (!tls) return unexpected{transport_error{transport_errc::io, tls.error()}};
    return connect(ep, timeout, tls->get());
}

transport_result<stream> stream::connect(const endpoint& ep, std::chrono::milliseconds timeout,
                                         const tls_context* tls) {
    asio::io_context io(1);
    auto failed = [&](transport_error e) -> transport_result<stream> {
        e.message = ep.to_string() + ": " + e.message;
        return unexpected{std::move(e)};
    };
    if (ep.type == endpoint::kind::unix_socket) {
        asio::local::stream_protocol::socket sock(io);
        auto fd = connect_within(io, sock, asio::local::stream_protocol::endpoint(ep.path), timeout);
        if (!fd) return failed(fd.error());
        tune_socket(*fd, false);
        stream s(*fd);
        s.peer_ = ep.to_string();
        return s;
    }
    error_code ec;
    asio::ip::tcp::resolver resolver(io);
    auto found = resolver.resolve(ep.host, std::to_string(ep.port), ec);
    if (ec) return unexpected{transport_error{transport_errc::bad_address, ep.host + ": " + ec.message()}};
    transport_error last{transport_errc::refused, "no address"};
    for (const auto& entry : found) {
        asio::ip::tcp::socket sock(io);
        auto fd = connect_within(io, sock, entry.endpoint(), timeout);
        if (!fd) {
            last = fd.error();
            continue;
        }
        tune_socket(*fd, true);
        stream s(*fd);
        s.peer_ = ep.to_string();
        if (tls)
            if (auto h = s.start_tls(*tls, ep.host, after(timeout)); !h) return failed(h.error());
        return s;
    }
    return failed(last);
}

namespace fault_injection {
#ifdef VCUDA_FAULT_INJECTION
namespace {
std::atomic<uint64_t> reads_left{0}, writes_left{0};  // 0: disarmed; 1: the next call fails

uint64_t env_count(const char* name) {
    const char* v = std::getenv(name);
    return v && *v ? std::strtoull(v, nullptr, 10) : 0;
}
// Armed from the environment before main() (the client library: when it is loaded).
[[maybe_unused]] const bool armed_from_env = [] {
    reads_left = env_count("VCUDA_FAULT_READ_N");
    writes_left = env_count("VCUDA_FAULT_WRITE_N");
    return true;
}();

bool fire(std::atomic<uint64_t>& left) {
    uint64_t n = left.load(std::memory_order_relaxed);
    while (n != 0)
        if (left.compare_exchange_weak(n, n - 1)) return n == 1;
    return false;
}
}  // namespace
bool available() { return true; }
void fail_read(uint64_t n) { reads_left = n; }
void fail_write(uint64_t n) { writes_left = n; }
#define VCUDA_INJECT_FAULT(counter, what)                      \
    do {                                                       \
        if (fault_injection::fire(fault_injection::counter)) { \
            ::shutdown(fd_, SHUT_RDWR);                        \
            return unexpected{lost("injected fault: " what)};  \
        }                                                      \
    } while (0)
#else
bool available() { return false; }
void fail_read(uint64_t) {}
void fail_write(uint64_t) {}
#define VCUDA_INJECT_FAULT(counter, what) \
    do {                                  \
    } while (0)
#endif
}  // namespace fault_injection

transport_error stream::lost(std::string why) {
    lost_ = true;
    if (!reported_.exchange(true)) {
        VCUDA_LOG_DEBUG("connection to {} lost: {}", peer_, why);
        return transport_error{transport_errc::peer_lost, std::move(why)};
    }
    return transport_error{transport_errc::closed, "connection already lost"};
}

transport_result<void> stream::wait(short events, deadline until) {
    pollfd p{fd_, events, 0};
    for (;;) {
        int n = ::poll(&p, 1, poll_timeout_ms(until));
        if (n > 0) return {};
        if (n == 0) return unexpected{transport_error{transport_errc::timeout, "deadline passed"}};
        if (errno != EINTR) return unexpected{lost(errno_text(errno))};
    }
}

transport_result<void> stream::write_all(std::span<iovec> bufs, deadline until, int pass_fd) {
    if (fd_ < 0 || lost_) return unexpected{transport_error{transport_errc::closed, "connection closed"}};
    if (pass_fd >= 0 && !local_)
        return unexpected{
            transport_error{transport_errc::io, "file descriptors pass only over Unix sockets"}};
    VCUDA_INJECT_FAULT(writes_left, "write");
    if (tls_) return tls_write(bufs, until);
    return rings_ ? ring_write(bufs, until, pass_fd) : socket_write(bufs, until, pass_fd);
}

transport_result<void> stream::start_tls(const tls_context& ctx, std::string_view host, deadline until) {
    if (fd_ < 0 || lost_) return unexpected{transport_error{transport_errc::closed, "connection closed"}};
    if (local_ || tls_ || rlen_ > rpos_)
        return unexpected{transport_error{transport_errc::io, "TLS starts on a fresh TCP connection only"}};
    auto c = tls_connection::handshake(fd_, ctx, host, until);
    if (!c) return unexpected{c.error()};
    tls_ = std::move(*c);
    return {};
}

std::string stream::tls_peer_subject() const { return tls_ ? tls_->peer_subject() : std::string(); }

// TLS has no scatter-gather write: a frame's header and metadata (and the small frames of a batch) are
// gathered into one record; pieces of a record's size or more go as they are.
transport_result<void> stream::tls_write(std::span<iovec> bufs, deadline until) {
    constexpr size_t gather = 16u << 10;  // a TLS record's most plaintext
    if (!wbuf_) wbuf_ = std::make_unique<char[]>(gather);
    auto put = [&](const char* p, size_t n) -> transport_result<void> {
        while (n > 0) {
            auto st = tls_->write(p, n);
            switch (st.status) {
                case tls_status::done:
                    p += st.bytes;
                    n -= st.bytes;
                    break;
                case tls_status::want_read:
                case tls_status::want_write:
                    if (auto w = wait(st.status == tls_status::want_read ? POLLIN : POLLOUT, until); !w)
                        return w;
                    break;
                case tls_status::closed:
                    return unexpected{lost("peer closed the connection")};
                case tls_status::failed:
                    return unexpected{lost("TLS: " + st.error)};
            }
        }
        return {};
    };
    size_t used = 0;
    for (auto& b : bufs) {
        auto* p = static_cast<const char*>(b.iov_base);
        if (b.iov_len <= gather - used) {
            std::memcpy(wbuf_.get() + used, p, b.iov_len);
            used += b.iov_len;
            continue;
        }
        if (used > 0)
            if (auto r = put(wbuf_.get(), used); !r) return r;
        used = 0;
        if (b.iov_len < gather) {
            std::memcpy(wbuf_.get(), p, b.iov_len);
            used = b.iov_len;
        } else if (auto r = put(p, b.iov_len); !r) {
            return r;
        }
    }
    if (used > 0) return put(wbuf_.get(), used);
    return {};
}

transport_result<size_t> stream::tls_read_some(void* dst, size_t n, short& wait_for) {
    auto st = tls_->read(dst, n);
    wait_for = 0;
    switch (st.status) {
        case tls_status::done:
            return st.bytes;
        case tls_status::want_read:
            wait_for = POLLIN;
            return size_t{0};
        case tls_status::want_write:
            wait_for = POLLOUT;
            return size_t{0};
        case tls_status::closed:
            return unexpected{lost("peer closed the connection")};
        case tls_status::failed:
            break;
    }
    return unexpected{lost("TLS: " + st.error)};
}

transport_result<void> stream::socket_write(std::span<iovec> bufs, deadline until, int pass_fd) {
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    size_t i = 0;
    while (i < bufs.size()) {
        if (bufs[i].iov_len == 0) {
            ++i;
            continue;
        }
        msghdr m{};
        m.msg_iov = &bufs[i];
        m.msg_iovlen = std::min<size_t>(bufs.size() - i, IOV_MAX);
        if (pass_fd >= 0) {  // rides on the first bytes that go out
            std::memset(control, 0, sizeof control);
            m.msg_control = control;
            m.msg_controllen = sizeof control;
            cmsghdr* c = CMSG_FIRSTHDR(&m);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int));
            std::memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
        }
        ssize_t n = ::sendmsg(fd_, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) pass_fd = -1;
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                if (auto w = wait(POLLOUT, until); !w) return w;
                continue;
            }
            return unexpected{lost(errno_text(errno))};
        }
        size_t left = static_cast<size_t>(n);
        while (i < bufs.size() && left >= bufs[i].iov_len) {
            left -= bufs[i].iov_len;
            ++i;
        }
        if (left > 0) {
            bufs[i].iov_base = static_cast<char*>(bufs[i].iov_base) + left;
            bufs[i].iov_len -= left;
        }
    }
    return {};
}

transport_result<void> stream::read_exact(void* buf, size_t n, deadline until) {
    if (fd_ < 0 || lost_) return unexpected{transport_error{transport_errc::closed, "connection closed"}};
    VCUDA_INJECT_FAULT(reads_left, "read");
    return rings_ ? ring_read(buf, n, until) : socket_read(buf, n, until);
}

void stream::keep_fds(void* msg) {
    auto* m = static_cast<msghdr*>(msg);
    for (cmsghdr* c = CMSG_FIRSTHDR(m); c; c = CMSG_NXTHDR(m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t k = 0; k < count; ++k) {
            int fd;
            std::memcpy(&fd, CMSG_DATA(c) + k * sizeof(int), sizeof fd);
            received_fds_.push_back(fd);
            ++fds_received_;
        }
    }
}

namespace {
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}
}  // namespace

// A reader that finds nothing spins up to spin_ (retrying the socket) before it sleeps in poll: a reply that
// comes within microseconds then costs no wake-up. Over TLS the same, with the TLS layer in place of recv.
transport_result<void> stream::socket_read(void* buf, size_t n, deadline until) {
    auto* p = static_cast<char*>(buf);
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
    clock::time_point spin_end{};
    if (!local_ && !rbuf_) rbuf_ = std::make_unique<char[]>(read_buffer_size);
    // Nothing to read now: spin, then wait for `events`.
    auto idle = [&](short events) -> transport_result<void> {
        if (spin_.count() > 0) {
            auto now = clock::now();
            if (spin_end == clock::time_point{}) spin_end = now + spin_;
            if (now < spin_end) {
                for (int i = 0; i < 16; ++i) cpu_relax();
                return {};
            }
        }
        spin_end = {};
        return wait(events, until);
    };
    while (n > 0) {
        if (rpos_ < rlen_) {  // bytes read ahead before
            size_t k = std::min(n, rlen_ - rpos_);
            std::memcpy(p, rbuf_.get() + rpos_, k);
            rpos_ += k;
            p += k;
            n -= k;
            continue;
        }
        // A small read fills the buffer: the bytes after it come with it.
        const bool fill = !local_ && n < read_buffer_size;
        if (tls_) {
            short events = 0;
            auto got = tls_read_some(fill ? rbuf_.get() : p, fill ? read_buffer_size : n, events);
            if (!got) return unexpected{got.error()};
            if (*got == 0) {
                if (auto w = idle(events); !w) return w;
            } else if (fill) {
                rpos_ = 0;
                rlen_ = *got;
            } else {
                p += *got;
                n -= *got;
            }
            continue;
        }
        ssize_t r;
        if (fill) {
            r = ::recv(fd_, rbuf_.get(), read_buffer_size, MSG_DONTWAIT);
            if (r > 0) {
                rpos_ = 0;
                rlen_ = static_cast<size_t>(r);
                continue;
            }
        } else if (local_) {  // descriptors passed with the bytes would be dropped by a plain recv
            iovec iov{p, n};
            msghdr m{};
            m.msg_iov = &iov;
            m.msg_iovlen = 1;
            m.msg_control = control;
            m.msg_controllen = sizeof control;
            r = ::recvmsg(fd_, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
            if (r > 0) keep_fds(&m);
        } else {
            r = ::recv(fd_, p, n, MSG_DONTWAIT);
        }
        if (r > 0) {
            p += r;
            n -= static_cast<size_t>(r);
            continue;
        }
        if (r == 0) return unexpected{lost("peer closed the connection")};
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (auto w = idle(POLLIN); !w) return w;
            continue;
        }
        return unexpected{lost(errno_text(errno))};
    }
    return {};
}

std::vector<std::byte> stream::take_buffered() {
    std::vector<std::byte> out(buffered());
    if (!out.empty()) std::memcpy(out.data(), rbuf_.get() + rpos_, out.size());
    rpos_ = rlen_ = 0;
    return out;
}

bool stream::put_back(std::span<const std::byte> bytes) {
    if (bytes.empty()) return true;
    if (local_ || buffered() != 0 || bytes.size() > read_buffer_size) return false;
    if (!rbuf_) rbuf_ = std::make_unique<char[]>(read_buffer_size);
    std::memcpy(rbuf_.get(), bytes.data(), bytes.size());
    rpos_ = 0;
    rlen_ = bytes.size();
    return true;
}

// ---------------------------------------------------------------- stream on shared-memory rings

std::chrono::microseconds default_spin() {
    if (const char* v = std::getenv("VCUDA_SPIN_US"); v && *v)
        return std::chrono::microseconds(std::strtoul(v, nullptr, 10));
    return std::chrono::microseconds(std::thread::hardware_concurrency() >= 4 ? 50 : 0);
}

void stream::attach_rings(std::unique_ptr<shm_rings> rings, std::chrono::microseconds spin) {
    rings_ = std::move(rings);
    spin_ = spin;
    fds_received_ = 0;  // the peer counts only descriptors it sends once rings are up (not the rings' own)
}

transport_result<void> stream::ring_write(std::span<iovec> bufs, deadline until, int pass_fd) {
    if (pass_fd >=
        0) {  // the descriptor first, on the socket, with one byte; then the count the reader checks
        char one = 0;
        iovec b{&one, 1};
        if (auto r = socket_write({&b, 1}, until, pass_fd); !r) return r;
        rings_->outbound().control().fds_sent.fetch_add(1, std::memory_order_seq_cst);
    }
    auto& out = rings_->outbound();
    auto& ctl = out.control();
    // The bytes become visible once all are in (one store of the head), or before waiting for room.
    auto publish = [&] {
        out.publish();
        // A sleeping reader gets one doorbell byte; it clears the flag when it wakes.
        if (ctl.reader_sleeping.load(std::memory_order_seq_cst) && ctl.reader_sleeping.exchange(0)) {
            char bell = 0;
            [[maybe_unused]] auto n = ::send(fd_, &bell, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
        }
    };
    for (auto& b : bufs) {
        auto* p = static_cast<const std::byte*>(b.iov_base);
        size_t left = b.iov_len;
        while (left > 0) {
            size_t w = out.write_some(p, left);
            if (w == SIZE_MAX) return unexpected{lost("the peer corrupted the frame ring")};
            p += w;
            left -= w;
            if (left > 0 && w == 0) {
                publish();
                if (auto r = wait_writable(until); !r) return r;
            }
        }
    }
    publish();
    return {};
}

// The ring is full: the reader is busy with earlier bytes. Spin, then nap, watching for the peer's end.
transport_result<void> stream::wait_writable(deadline until) {
    auto& out = rings_->outbound();
    auto spin_end = clock::now() + spin_;
    while (clock::now() < spin_end)
        for (int i = 0; i < 64; ++i) {
            if (out.writable()) return {};
            cpu_relax();
        }
    for (;;) {
        if (out.writable()) return {};
        if (until && clock::now() >= *until)
            return unexpected{transport_error{transport_errc::timeout, "deadline passed"}};
        pollfd p{fd_, POLLRDHUP, 0};
        if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
            return unexpected{lost("peer closed the connection")};
        std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
}

transport_result<void> stream::ring_read(void* buf, size_t n, deadline until) {
    auto& in = rings_->inbound();
    auto* p = static_cast<std::byte*>(buf);
    while (n > 0) {
        size_t r = in.read_some(p, n);
        if (r == SIZE_MAX) return unexpected{lost("the peer corrupted the frame ring")};
        if (r > 0) {
            p += r;
            n -= r;
            continue;
        }
        if (auto w = wait_readable(until); !w) return w;
    }
    return {};
}

transport_result<void> stream::wait_readable(deadline until) {
    auto& in = rings_->inbound();
    if (spin_.count() > 0) {
        auto spin_end = clock::now() + spin_;
        do
            for (int i = 0; i < 64; ++i) {
                if (in.readable()) return {};
                cpu_relax();
            }
        while (clock::now() < spin_end);
    }
    auto& ctl = in.control();
    for (;;) {
        ctl.reader_sleeping.store(
            1, std::memory_order_seq_cst);  // then look again: pairs with the writer's head store
        if (in.readable()) {
            ctl.reader_sleeping.store(0, std::memory_order_relaxed);
            return {};
        }
        pollfd pf{fd_, POLLIN, 0};
        int k = ::poll(&pf, 1, poll_timeout_ms(until));
        ctl.reader_sleeping.store(0, std::memory_order_relaxed);
        if (k < 0) {
            if (errno == EINTR) continue;
            return unexpected{lost(errno_text(errno))};
        }
        if (in.readable()) return {};  // before the socket: a peer may write its last frame and then close
        if (k > 0)
            if (auto d = drain_socket(); !d) return d;
        if (in.readable()) return {};
        if (k == 0) return unexpected{transport_error{transport_errc::timeout, "deadline passed"}};
    }
}

transport_result<void> stream::drain_socket() {
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
    char bytes[256];
    for (;;) {
        iovec iov{bytes, sizeof bytes};
        msghdr m{};
        m.msg_iov = &iov;
        m.msg_iovlen = 1;
        m.msg_control = control;
        m.msg_controllen = sizeof control;
        ssize_t r = ::recvmsg(fd_, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (r > 0) {
            keep_fds(&m);
            continue;
        }
        if (r == 0) return unexpected{lost("peer closed the connection")};
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return {};
        return unexpected{lost(errno_text(errno))};
    }
}

void stream::shutdown() {
    if (fd_ >= 0 && !lost_.exchange(true)) {
        reported_ = true;
        ::shutdown(fd_, SHUT_RDWR);
    }
}

bool stream::peer_gone() const {
    if (fd_ < 0 || lost_) return true;
    pollfd p{fd_, POLLRDHUP, 0};
    int n;
    do n = ::poll(&p, 1, 0);
    while (n < 0 && errno == EINTR);
    return n > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

// ---------------------------------------------------------------- listener

struct listener::acceptor_state {
    asio::io_context io{1};
    std::optional<asio::ip::tcp::acceptor> tcp;
    std::optional<asio::local::stream_protocol::acceptor> local;
    std::atomic<bool> closed{false};
    void close_acceptor() {
        error_code ignored;
        if (tcp) tcp->close(ignored);
        if (local) local->close(ignored);
    }
};

listener::listener() = default;
listener::listener(listener&& o) noexcept
    : acc_(std::move(o.acc_)), local_(std::move(o.local_)), tls_(std::move(o.tls_)) {}
listener& listener::operator=(listener&& o) noexcept {
    if (this != &o) {
        this->~listener();
        new (this) listener(std::move(o));
    }
    return *this;
}
listener::~listener() {
    if (!acc_) return;
    const bool bound = acc_->tcp ? acc_->tcp->is_open() : acc_->local && acc_->local->is_open();
    acc_->close_acceptor();
    if (acc_->local && bound) ::unlink(local_.path.c_str());
}

transport_result<listener> listener::listen(const endpoint& ep, int backlog) {
    listener l;
    l.local_ = ep;
    l.acc_ = std::make_unique<acceptor_state>();
    auto& a = *l.acc_;
    error_code ec;
    auto failed = [&](const error_code& e) -> transport_result<listener> {
        return unexpected{transport_error{transport_errc::io, ep.to_string() + ": " + e.message()}};
    };
    if (ep.type == endpoint::kind::unix_socket) {
        // A stale socket file from a crashed server would block the bind; replace it only if nobody answers
        // there. Probe before `l` owns a socket: a listener that owns one unlinks its path when it goes, and
        // here that path would be the live server's.
        if (auto probe = stream::connect(ep, std::chrono::milliseconds(200)); probe)
            return unexpected{transport_error{transport_errc::io,
                                              ep.to_string() + " is already served by another process"}};
        ::unlink(ep.path.c_str());
        auto& acc = a.local.emplace(a.io);
        // Owner and group only (0660), set before listen() so that nobody else ever connects; who of them may
        // is the server's business (SO_PEERCRED).
        if (acc.open(asio::local::stream_protocol(), ec); ec) return failed(ec);
        ::fcntl(acc.native_handle(), F_SETFD, FD_CLOEXEC);
        if (acc.bind(asio::local::stream_protocol::endpoint(ep.path), ec); ec) return failed(ec);
        if (::chmod(ep.path.c_str(), 0660) != 0)
            return failed(error_code(errno, boost::system::system_category()));
        if (acc.listen(backlog, ec); ec) return failed(ec);
        return l;
    }
    asio::ip::tcp::resolver resolver(a.io);
    auto found = resolver.resolve(ep.host, std::to_string(ep.port), asio::ip::tcp::resolver::passive, ec);
    if (ec || found.empty())
        return unexpected{transport_error{transport_errc::bad_address,
                                          ep.host + ": " + (ec ? ec.message() : "no address")}};
    const auto at = found.begin()->endpoint();
    auto& acc = a.tcp.emplace(a.io);
    if (acc.open(at.protocol(), ec); ec) return failed(ec);
    ::fcntl(acc.native_handle(), F_SETFD, FD_CLOEXEC);
    acc.set_option(asio::socket_base::reuse_address(true), ec);
    if (acc.bind(at, ec); ec) return failed(ec);
    if (acc.listen(backlog, ec); ec) return failed(ec);
    l.local_.port = acc.local_endpoint(ec).port();  // "host:0": the port the system chose
    return l;
}

namespace {

// One accept on `acc` by `until` (an Asio timer), or until close() (posted to the same io_context): the new
// connection's descriptor, close-on-exec, and the peer's address when it has one.
template <class Acceptor, class Socket>
transport_result<int> accept_within(asio::io_context& io, Acceptor& acc, Socket& peer,
                                    typename Acceptor::endpoint_type& from, deadline until) {
    error_code result = asio::error::would_block;
    bool timed_out = false;
    asio::steady_timer timer(io);
    acc.async_accept(peer, from, [&](const error_code& ec) {
        result = ec;
        timer.cancel();
    });
    if (until) {
        timer.expires_at(*until);
        timer.async_wait([&](const error_code& ec) {
            if (ec) return;  // cancelled: the accept came first
            timed_out = true;
            error_code ignored;
            acc.cancel(ignored);
        });
    }
    io.restart();
    io.run();
    if (timed_out && result == asio::error::operation_aborted)
        return unexpected{transport_error{transport_errc::timeout, "no connection"}};
    if (result) return unexpected{transport_error{transport_errc::io, result.message()}};
    return release_descriptor(peer);
}

}  // namespace

transport_result<stream> listener::accept(deadline until) {
    for (;;) {
        if (!acc_ || acc_->closed.load())
            return unexpected{transport_error{transport_errc::closed, "listener closed"}};
        auto& a = *acc_;
        std::string peer_text;
        transport_result<int> fd = -1;
        if (a.tcp) {
            asio::ip::tcp::socket peer(a.io);
            asio::ip::tcp::endpoint from;
            fd = accept_within(a.io, *a.tcp, peer, from, until);
            const std::string host = from.address().to_string();
            peer_text =
                (from.address().is_v6() ? "[" + host + "]" : host) + ":" + std::to_string(from.port());
        } else {
            asio::local::stream_protocol::socket peer(a.io);
            asio::local::stream_protocol::endpoint from;
            fd = accept_within(a.io, *a.local, peer, from, until);
            peer_text = local_.to_string() + " (local peer)";
        }
        if (a.closed.load()) {
            if (fd) ::close(*fd);
            return unexpected{transport_error{transport_errc::closed, "listener closed"}};
        }
        if (!fd) return unexpected{fd.error()};
        tune_socket(*fd, a.tcp.has_value());
        stream s(*fd);
        s.set_peer_description(peer_text);
        return s;
    }
}

void listener::close() {
    if (!acc_ || acc_->closed.exchange(true)) return;
    // On the io_context an accept() runs in: the acceptor is touched by one thread at a time.
    asio::post(acc_->io, [a = acc_.get()] { a->close_acceptor(); });
}

// ---------------------------------------------------------------- frame_stream

std::vector<std::byte> frame_bytes(const frame& f) {
    frame_header h = f.header;
    h.meta_len = static_cast<uint32_t>(f.meta.size());
    h.payload_len = f.payload.size();
    std::vector<std::byte> out(frame_header_size + f.meta.size() + f.payload.size());
    encode_header(h, out.data());
    std::copy(f.meta.begin(), f.meta.end(), out.begin() + frame_header_size);
    std::copy(f.payload.begin(), f.payload.end(),
              out.begin() + static_cast<std::ptrdiff_t>(frame_header_size + f.meta.size()));
    return out;
}

transport_result<frame> frame_from_bytes(std::span<const std::byte> bytes, const frame_limits& limits) {
    if (bytes.size() < frame_header_size)
        return unexpected{transport_error{transport_errc::protocol, "shorter than a frame header"}};
    auto h = check_header(bytes.first(frame_header_size), limits);
    if (!h) return unexpected{transport_error{transport_errc::protocol, h.error().message}};
    if (bytes.size() != frame_header_size + h->meta_len + h->payload_len)
        return unexpected{transport_error{transport_errc::protocol, "the frame's length does not match"}};
    frame f;
    f.header = *h;
    auto meta = bytes.subspan(frame_header_size, h->meta_len);
    f.meta.assign(meta.begin(), meta.end());
    if (auto v = verify_metadata(f.kind(), f.meta, limits); !v)
        return unexpected{transport_error{transport_errc::protocol, v.error().message}};
    auto payload = bytes.subspan(frame_header_size + h->meta_len);
    f.payload.assign(payload.begin(), payload.end());
    return f;
}

transport_result<void> frame_stream::send(std::span<const outgoing_frame> frames, deadline until,
                                          int pass_fd) {
    // One frame (replies, bulk chunks) is laid out on the stack: no allocation per frame.
    std::byte one_header[frame_header_size];
    iovec one_iov[3];
    std::vector<std::byte> headers;
    std::vector<iovec> iov_list;
    std::byte* hdr = one_header;
    iovec* iov = one_iov;
    if (frames.size() > 1) {
        headers.resize(frames.size() * frame_header_size);
        iov_list.resize(frames.size() * 3);
        hdr = headers.data();
        iov = iov_list.data();
    }
    size_t n = 0;
    for (size_t i = 0; i < frames.size(); ++i) {
        frame_header h = frames[i].header;
        h.meta_len = static_cast<uint32_t>(frames[i].meta.size());
        h.payload_len = frames[i].payload.size();
        encode_header(h, &hdr[i * frame_header_size]);
        iov[n++] = {&hdr[i * frame_header_size], frame_header_size};
        if (!frames[i].meta.empty())
            iov[n++] = {const_cast<std::byte*>(frames[i].meta.data()), frames[i].meta.size()};
        if (!frames[i].payload.empty())
            iov[n++] = {const_cast<std::byte*>(frames[i].payload.data()), frames[i].payload.size()};
    }
    std::lock_guard lock(*write_mutex_);
    return s_.write_all({iov, n}, until, pass_fd);
}

transport_result<frame> frame_stream::receive(deadline first_byte, std::chrono::milliseconds rest,
                                              const payload_sink& sink) {
    frame f;
    if (auto r = receive_into(f, first_byte, rest, sink); !r) return unexpected{r.error()};
    return f;
}

transport_result<void> frame_stream::receive_into(frame& f, deadline first_byte,
                                                  std::chrono::milliseconds rest, const payload_sink& sink) {
    std::byte raw[frame_header_size];
    // The first byte may be waited for until `first_byte`; a header that came with earlier bytes is copied at
    // once.
    size_t have = 0;
    if (s_.buffered() < frame_header_size) {
        if (auto r = s_.read_exact(raw, 1, first_byte); !r) return unexpected{r.error()};
        have = 1;
    }
    deadline until = after(rest);
    if (auto r = s_.read_exact(raw + have, frame_header_size - have, until); !r) return unexpected{r.error()};
    auto h = check_header(raw, limits_);
    if (!h) return unexpected{transport_error{transport_errc::protocol, h.error().message}};
    f.header = *h;
    f.meta.resize(h->meta_len);
    f.payload.clear();
    if (h->meta_len)
        if (auto r = s_.read_exact(f.meta.data(), h->meta_len, until); !r) return unexpected{r.error()};
    if (auto v = verify_metadata(f.kind(), f.meta, limits_); !v)
        return unexpected{transport_error{transport_errc::protocol, v.error().message}};
    if (!h->payload_len) return {};
    // Bulk payloads may be large: allow the per-frame time to scale (1 s per 64 MiB beyond the base).
    deadline payload_until =
        until ? deadline(*until + std::chrono::milliseconds((h->payload_len >> 26) * 1000)) : until;
    if (std::byte* dst = sink ? sink(f.header, f.meta) : nullptr)
        return s_.read_exact(dst, h->payload_len, payload_until);
    // The length is the peer's word (up to limits_.max_payload, 1 GiB): the buffer is reserved at once, which
    // takes address space but no memory (glibc maps any allocation over 32 MiB afresh), and its pages are
    // touched only a step ahead of the bytes that arrive, so that a peer that announces a gigabyte and sends
    // nothing makes the process hold one step, not the gigabyte (resize() writes every byte it adds). The
    // bytes are read once, straight into place, as before.
    constexpr uint64_t step = uint64_t{8} << 20;
    f.payload.reserve(h->payload_len);
    while (f.payload.size() < h->payload_len) {
        size_t have = f.payload.size();
        size_t n = std::min<uint64_t>(step, h->payload_len - have);
        f.payload.resize(have + n);
        if (auto r = s_.read_exact(f.payload.data() + have, n, payload_until); !r)
            return unexpected{r.error()};
    }
    return {};
}

}  // namespace vcuda
