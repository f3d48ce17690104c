// TLS for vcuda's TCP connections (lanes, bulk connections, the manager protocol): OpenSSL on the connected
// socket (SSL_set_fd), under the byte stream of common/transport.hpp. Unix sockets and shared-memory rings
// stay plain: they never leave the host. A `tls_context` is the configuration of one side: a server's (or
// manager's) certificate and key, and the CA its clients' certificates must be signed by when it requires
// them (mutual TLS); a client's CA, which the server's certificate must chain to and whose name or IP address
// must match the address dialled, and its own certificate and key for mutual TLS. TLS 1.3 only (both ends are
// vcuda), no session tickets, no renegotiation. A `tls_connection` is one connection's TLS state after its
// handshake; the stream calls read/write on it. runs on: any thread. tls_context is immutable once made and
// shared by every connection; a tls_connection is used by its stream's one reader and one writer thread, its
// calls serialized by its own mutex (an OpenSSL connection must not be entered by two threads at once);
// neither ever blocks: the socket is non-blocking and the stream waits for it between calls.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "common/result.hpp"
#include "common/transport.hpp"

struct ssl_ctx_st;  // OpenSSL's SSL_CTX
struct ssl_st;      // OpenSSL's SSL

namespace vcuda {

// Files in PEM format. Server: cert and key (the certificate may be followed by its chain), ca = require
// client certificates signed by it (empty: no client certificate asked for). Client: ca = trust the server's
// certificate only if it chains to it; cert and key (both or neither) = present this certificate when the
// server asks for one.
struct tls_files {
    std::string cert;
    std::string key;
    std::string ca;
};

class tls_context {
  public:
    // Errors name the file and say what is wrong with it (unreadable, not PEM, key not matching the
    // certificate), for start-up messages.
    static result<std::shared_ptr<const tls_context>, std::string> server(const tls_files& files);
    static result<std::shared_ptr<const tls_context>, std::string> client(const tls_files& files);
    // The client context of this process, from VCUDA_TLS_CA (on when set), VCUDA_TLS_CERT and VCUDA_TLS_KEY;
    // null when VCUDA_TLS_CA is unset or empty (TCP is then plain). Made once per distinct setting (the files
    // are read at the first connection, not at every one).
    static result<std::shared_ptr<const tls_context>, std::string> from_environment();

    tls_context(const tls_context&) = delete;
    tls_context& operator=(const tls_context&) = delete;
    ~tls_context();

    bool is_server() const { return server_; }
    // Server: client certificates are required (mutual TLS).
    bool requires_client_certificate() const { return verify_clients_; }
    ssl_ctx_st* native() const { return ctx_; }

  private:
    tls_context(ssl_ctx_st* ctx, bool server, bool verify_clients)
        : ctx_(ctx), server_(server), verify_clients_(verify_clients) {}
    ssl_ctx_st* ctx_;
    bool server_;
    bool verify_clients_;
};

enum class tls_status {
    done,        // `bytes` were read or written
    want_read,   // nothing to do until the socket is readable: poll for POLLIN, then call again
    want_write,  // until it is writable (POLLOUT)
    closed,      // the peer ended the connection
    failed,      // a TLS error: `error` says which
};
struct tls_step {
    tls_status status = tls_status::done;
    size_t bytes = 0;
    std::string error;
};

class tls_connection {
  public:
    // The handshake on connected socket `fd` (made non-blocking), by `until`. A client verifies the server's
    // certificate against its CA and `host` (a DNS name, or an IP address as text). The errors say what the
    // user can do: the CA that does not match, the name that does not, a server that does not speak TLS, a
    // missing client certificate.
    static transport_result<std::unique_ptr<tls_connection>> handshake(int fd, const tls_context& ctx,
                                                                       std::string_view host, deadline until);
    tls_connection(const tls_connection&) = delete;
    tls_connection& operator=(const tls_connection&) = delete;
    ~tls_connection();

    // At most n bytes, whatever one record gives.
    tls_step read(void* buf, size_t n);
    // Some of n bytes (whole records); after want_read/want_write call again with the same bytes.
    tls_step write(const void* buf, size_t n);
    // The peer certificate's subject ("CN=..."), or "" when it sent none.
    std::string peer_subject() const;

  private:
    explicit tls_connection(ssl_st* ssl) : ssl_(ssl) {}
    ssl_st* ssl_;
    mutable std::mutex mu_;
};

// The server side of a connection accepted on a TLS listener: the handshake, by `until`. A peer that sent a
// plain vcuda frame instead (a client without VCUDA_TLS_CA) has that frame read and is answered in plain with
// an error frame saying that this address speaks TLS only, so that it reports why instead of a closed
// connection; the result is then an error too.
transport_result<void> accept_tls(frame_stream& fs, const tls_context& ctx, deadline until);

}  // namespace vcuda
