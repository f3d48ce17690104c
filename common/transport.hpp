// Byte streams between vcuda processes: TCP between hosts (in TLS where configured: common/tls.hpp), Unix
// domain sockets on one host.
// A `stream` is a connected socket with deadline-bounded reads and scatter-gather writes; a `frame_stream`
// moves whole frames over it (common/frame.hpp). A lost peer is reported once, as transport_errc::peer_lost;
// after that every call answers transport_errc::closed without touching the socket.
// runs on: one reader thread and one writer thread at a time (reads and writes may overlap).
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/frame.hpp"
#include "common/result.hpp"
#include "common/shm_ring.hpp"

namespace vcuda {

class tls_context;
class tls_connection;

// How long a reader on shared-memory rings spins before it sleeps: `VCUDA_SPIN_US` if set, else 50 µs where
// the machine has 4 or more hardware threads (spinning on fewer would take the peer's CPU), else 0.
std::chrono::microseconds default_spin();

enum class transport_errc {
    peer_lost,    // the other side closed or reset the connection, or vanished mid-frame
    closed,       // this stream was already closed or lost earlier
    timeout,      // a deadline passed
    refused,      // nothing listens at the address
    bad_address,  // the address could not be parsed or resolved
    io,           // any other system error
    protocol,     // the peer sent a frame that failed checks (see message)
};
std::string_view to_string(transport_errc e);

struct transport_error {
    transport_errc code = transport_errc::io;
    std::string message;
};

template <class T>
using transport_result = result<T, transport_error>;

using clock = std::chrono::steady_clock;
// A point in time after which a wait gives up; `never` waits for ever (still ends when the peer goes).
using deadline = std::optional<clock::time_point>;
inline constexpr deadline never = std::nullopt;
inline deadline after(std::chrono::milliseconds d) { return clock::now() + d; }

// "host:port", "tcp://host:port", "unix:/path" or "unix:///path".
struct endpoint {
    enum class kind { tcp, unix_socket } type = kind::tcp;
    std::string host;
    uint16_t port = 0;
    std::string path;

    static result<endpoint, std::string> parse(std::string_view text);
    std::string to_string() const;
};

// True for addresses of this host only: 127.0.0.0/8, ::1 (also as ::ffff:127.x), and names that resolve to
// nothing else ("localhost"). What a listener may serve without authentication.
bool is_loopback(const std::string& host);

// Test-only fault injection, for tests that sweep every failure point of a session: the Nth call of
// stream::read_exact (or stream::write_all) in this process from the moment it is armed, counted across all
// its streams, fails as if the peer had vanished (the socket is shut down; the call returns peer_lost). Built
// only with the CMake option VCUDA_FAULT_INJECTION (on where tests are built, off in the release preset):
// without it arming does nothing and the checks compile away. A process can also be armed from its start by
// the environment, VCUDA_FAULT_READ_N=N / VCUDA_FAULT_WRITE_N=N (a server or a client library under test).
// runs on: any thread; one counter per direction, shared by the process's streams.
namespace fault_injection {
bool available();
void fail_read(uint64_t n);   // 0 disarms
void fail_write(uint64_t n);  // 0 disarms
}  // namespace fault_injection

class stream {
  public:
    stream();
    explicit stream(int fd);
    stream(stream&& o) noexcept;
    stream& operator=(stream&& o) noexcept;
    stream(const stream&) = delete;
    stream& operator=(const stream&) = delete;
    ~stream();

    // TCP goes in TLS when this process's environment asks for it (VCUDA_TLS_CA:
    // tls_context::from_environment), else plain; a Unix socket is always plain.
    static transport_result<stream> connect(const endpoint& ep, std::chrono::milliseconds timeout);
    // The same with an explicit TLS client context for TCP (null: plain).
    static transport_result<stream> connect(const endpoint& ep, std::chrono::milliseconds timeout,
                                            const tls_context* tls);
    // The TLS handshake on this connected TCP socket, by `until`, before any byte was read or written; then
    // every byte goes through TLS. A client names the `host` the server's certificate must be for; a server
    // passes "" (see accept_tls in common/tls.hpp, which also answers a plain client).
    transport_result<void> start_tls(const tls_context& ctx, std::string_view host, deadline until);
    bool is_tls() const { return tls_ != nullptr; }
    // The peer's certificate subject over TLS (a client's, under mutual TLS), else "".
    std::string tls_peer_subject() const;

    // Writes every byte of every buffer (one writev per pass; partial writes continue). On a Unix socket,
    // `pass_fd` >= 0 travels with the first bytes (SCM_RIGHTS); the caller still owns and closes its copy.
    transport_result<void> write_all(std::span<iovec> bufs, deadline until = never, int pass_fd = -1);
    // Reads exactly n bytes; a peer that closes before n bytes is peer_lost. File descriptors that arrive
    // with the bytes (Unix sockets) are kept, in order, for take_fd().
    transport_result<void> read_exact(void* buf, size_t n, deadline until = never);
    // The oldest file descriptor received and not yet taken (the caller owns it), or -1.
    int take_fd();
    // Both ends on this host: a Unix socket, which can pass file descriptors and so share memory.
    bool is_local() const { return local_; }
    // From now on bytes travel through `rings` (both ends switch right after HELLO); the socket keeps
    // carrying file descriptors, doorbells and the end of the connection. A reader spins up to `spin` before
    // it sleeps.
    void attach_rings(std::unique_ptr<shm_rings> rings, std::chrono::microseconds spin);
    bool has_rings() const { return rings_ != nullptr; }
    // Bytes read ahead from a TCP socket and not yet handed out (0 on other streams).
    size_t buffered() const { return rlen_ - rpos_; }
    // Those bytes, taken out: the socket goes to another process (--isolation process), which puts them
    // back in front of what it reads with put_back (as many as read_buffer_size at most).
    std::vector<std::byte> take_buffered();
    bool put_back(std::span<const std::byte> bytes);
    // A reader on the socket spins up to `spin` (retrying it) before it sleeps (rings: attach_rings' own
    // spin).
    void set_spin(std::chrono::microseconds spin) { spin_ = spin; }

    // Ends the connection: pending and later reads and writes fail with `closed`.
    void shutdown();
    // True when the peer has closed or reset its end (or this end was shut down), looked at without reading
    // or waiting: for a thread that waits on something else (a host function's turn, another lane) while its
    // client may have gone.
    bool peer_gone() const;
    bool is_open() const { return fd_ >= 0 && !lost_.load(); }
    int native_handle() const { return fd_; }
    std::string peer_description() const { return peer_; }
    void set_peer_description(std::string p) { peer_ = std::move(p); }

  private:
    transport_error lost(std::string why);
    transport_result<void> wait(short events, deadline until);
    transport_result<void> socket_write(std::span<iovec> bufs, deadline until, int pass_fd);
    transport_result<void> socket_read(void* buf, size_t n, deadline until);
    transport_result<void> tls_write(std::span<iovec> bufs, deadline until);
    // One read from the TLS layer into dst: the bytes (> 0), or 0 with `wait_for` set (POLLIN/POLLOUT) when
    // it needs the socket first; an error when the connection ended.
    transport_result<size_t> tls_read_some(void* dst, size_t n, short& wait_for);
    transport_result<void> ring_write(std::span<iovec> bufs, deadline until, int pass_fd);
    transport_result<void> ring_read(void* buf, size_t n, deadline until);
    transport_result<void> wait_readable(deadline until);
    transport_result<void> wait_writable(deadline until);
    transport_result<void> drain_socket();  // doorbells and descriptors (rings mode); EOF is the peer's end
    void keep_fds(void* msg);               // SCM_RIGHTS descriptors of a received msghdr

    void close_received();

    int fd_ = -1;
    bool local_ = false;
    // TCP reads go through this buffer: a frame's header and metadata (and the next frames of a batch) then
    // cost one recv, not one each. Unix sockets read exactly, since descriptors travel with particular bytes.
    static constexpr size_t read_buffer_size = 64u << 10;
    std::unique_ptr<char[]> rbuf_;
    size_t rpos_ = 0, rlen_ = 0;
    std::unique_ptr<shm_rings> rings_;
    std::chrono::microseconds spin_{0};
    uint64_t fds_received_ = 0;
    std::atomic<bool> lost_{false};
    std::atomic<bool> reported_{false};
    std::string peer_;
    std::deque<int> received_fds_;  // touched by the reading thread only
    std::unique_ptr<tls_connection> tls_;
    std::unique_ptr<char[]> wbuf_;  // TLS: a write's small pieces gathered into one record (the writer's)
};

// Listening and connecting go through Boost.Asio (acceptors, resolver, connects, timers for their deadlines).
// A connected socket then leaves Asio: its reads and writes are non-blocking system calls and poll() with the
// call's deadline, on the thread that serves it (a lane's, the server's thread per connection), because they
// pass descriptors (SCM_RIGHTS), ring doorbells and TLS records that Asio's synchronous operations cannot
// bound by a deadline, and its asynchronous ones would need an io_context per connection.
class listener {
  public:
    listener();
    listener(listener&&) noexcept;
    listener& operator=(listener&&) noexcept;
    ~listener();

    // A Unix socket is made with mode 0660 (its owner and group may connect).
    static transport_result<listener> listen(const endpoint& ep, int backlog = 256);
    // A TCP listener whose connections speak TLS with this server context: whoever serves an accepted
    // connection runs accept_tls (common/tls.hpp) on its own thread before anything else.
    void set_tls(std::shared_ptr<const tls_context> ctx) { tls_ = std::move(ctx); }
    const std::shared_ptr<const tls_context>& tls() const { return tls_; }
    // Waits for a connection; returns `closed` once close() was called.
    transport_result<stream> accept(deadline until = never);
    void close();
    // The bound address; for "host:0" it carries the port the system chose.
    const endpoint& local() const { return local_; }

  private:
    struct acceptor_state;  // Asio's acceptor and the io_context an accept() waits in (common/transport.cpp)
    std::unique_ptr<acceptor_state> acc_;
    endpoint local_;
    std::shared_ptr<const tls_context> tls_;
};

// One received frame. The metadata is verified; the payload is in `payload` unless the receiver asked for it
// to be delivered elsewhere (receive()'s payload_sink).
struct frame {
    frame_header header;
    std::vector<std::byte> meta;
    std::vector<std::byte> payload;
    frame_kind kind() const { return static_cast<frame_kind>(header.kind); }
};

// A received frame as the bytes it came in (header, metadata, payload), and those bytes back into a frame,
// checked as receive() checks it: a connection's HELLO read by one process (the server under --isolation
// process) is handed with the connection to another (the session's worker), which must not read it again.
std::vector<std::byte> frame_bytes(const frame& f);
transport_result<frame> frame_from_bytes(std::span<const std::byte> bytes, const frame_limits& limits);

// One frame to send: the metadata and payload spans must stay valid until send() returns.
struct outgoing_frame {
    frame_header header;
    std::span<const std::byte> meta;
    std::span<const std::byte> payload;
};

// Where a frame's payload goes: returns a buffer of `len` bytes to read it into, or nullptr to use
// frame::payload.
using payload_sink = std::function<std::byte*(const frame_header& h, const std::vector<std::byte>& meta)>;

class frame_stream {
  public:
    explicit frame_stream(stream s, frame_limits limits = {}) : s_(std::move(s)), limits_(limits) {}

    // Sends the frames in order in one scatter-gather write (split only where the system's iovec limit forces
    // it). `pass_fd` >= 0: a file descriptor that travels with the frames (Unix sockets only; see
    // stream::write_all).
    transport_result<void> send(std::span<const outgoing_frame> frames, deadline until = never,
                                int pass_fd = -1);
    transport_result<void> send(const outgoing_frame& f, deadline until = never, int pass_fd = -1) {
        return send({&f, 1}, until, pass_fd);
    }

    // Receives one frame: waits up to `first_byte` for it to start, then up to `rest` for the remainder.
    transport_result<frame> receive(deadline first_byte = never,
                                    std::chrono::milliseconds rest = std::chrono::seconds(30),
                                    const payload_sink& sink = {});
    // The same into `f`, whose buffers are reused: a loop that receives many frames allocates nothing per
    // frame once its buffers have grown (bulk connections). `f` holds the frame when this succeeds.
    transport_result<void> receive_into(frame& f, deadline first_byte = never,
                                        std::chrono::milliseconds rest = std::chrono::seconds(30),
                                        const payload_sink& sink = {});

    stream& raw() { return s_; }
    const frame_limits& limits() const { return limits_; }
    // Limits for the frames received from now on (a connection whose role HELLO decided: bulk connections).
    void set_limits(const frame_limits& l) { limits_ = l; }
    void shutdown() { s_.shutdown(); }

  private:
    stream s_;
    frame_limits limits_;
    std::unique_ptr<std::mutex> write_mutex_ =
        std::make_unique<std::mutex>();  // whole frames never interleave
};

}  // namespace vcuda
