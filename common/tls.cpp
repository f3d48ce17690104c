#include "common/tls.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>

#include "common/log.hpp"
#include "common/wire.hpp"

namespace vcuda {

namespace {

// The reason of the oldest error OpenSSL queued on this thread (the first failure; later ones follow from
// it), and the queue cleared.
std::string openssl_error() {
    unsigned long first = ERR_get_error();
    while (ERR_get_error() != 0) {
    }
    if (first == 0) return "unknown TLS error";
    const char* reason = ERR_reason_error_string(first);
    if (reason) return reason;
    char text[256];
    ERR_error_string_n(first, text, sizeof text);
    return text;
}

// "cannot read FILE: why" when the file cannot be opened, else "".
std::string unreadable(const std::string& path) {
    std::FILE* f = std::fopen(path.c_str(), "r");
    if (!f) return "cannot read " + path + ": " + std::strerror(errno);
    std::fclose(f);
    return {};
}

SSL_CTX* new_context(bool server) {
    SSL_CTX* ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
    if (!ctx) return nullptr;
    SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
    // No resumption (every connection does a full handshake): no tickets to store, nothing to steal.
    SSL_CTX_set_num_tickets(ctx, 0);
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    // A peer that closes without close_notify ends the connection as any closed socket does: frames carry
    // their own lengths, so a cut-off frame is noticed without it.
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_TICKET);
    // Retries after want_write pass the same bytes, perhaps at another address (a gathered buffer reused).
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    return ctx;
}

// Loads cert and key into ctx; "" on success, else what is wrong, naming the file.
std::string load_identity(SSL_CTX* ctx, const std::string& cert, const std::string& key) {
    if (auto u = unreadable(cert); !u.empty()) return u;
    if (auto u = unreadable(key); !u.empty()) return u;
    if (SSL_CTX_use_certificate_chain_file(ctx, cert.c_str()) != 1)
        return cert + ": not a PEM certificate (" + openssl_error() + ")";
    if (SSL_CTX_use_PrivateKey_file(ctx, key.c_str(), SSL_FILETYPE_PEM) != 1) {
        int reason = ERR_GET_REASON(ERR_peek_error());
        if (reason == X509_R_KEY_VALUES_MISMATCH || reason == X509_R_KEY_TYPE_MISMATCH)
            return key + " is not the private key of the certificate in " + cert + " (" + openssl_error() +
                   ")";
        return key + ": not a PEM private key (" + openssl_error() + ")";
    }
    if (SSL_CTX_check_private_key(ctx) != 1)
        return key + " is not the private key of the certificate in " + cert + " (" + openssl_error() + ")";
    return {};
}

std::string load_ca(SSL_CTX* ctx, const std::string& ca) {
    if (auto u = unreadable(ca); !u.empty()) return u;
    if (SSL_CTX_load_verify_locations(ctx, ca.c_str(), nullptr) != 1)
        return ca + ": no PEM certificate in it (" + openssl_error() + ")";
    return {};
}

bool is_ip_address(const std::string& host) {
    in_addr a4{};
    in6_addr a6{};
    return inet_pton(AF_INET, host.c_str(), &a4) == 1 || inet_pton(AF_INET6, host.c_str(), &a6) == 1;
}

int poll_ms(deadline until) {
    if (!until) return -1;
    auto left = std::chrono::ceil<std::chrono::milliseconds>(*until - clock::now()).count();
    return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, INT_MAX));
}

// Waits for `events` on fd by `until`: "" when ready, else why not.
std::string wait_for(int fd, short events, deadline until) {
    pollfd p{fd, events, 0};
    for (;;) {
        int n = ::poll(&p, 1, poll_ms(until));
        if (n > 0) return {};
        if (n == 0) return "timed out";
        if (errno != EINTR) return std::strerror(errno);
    }
}

// What a failed handshake means for the user, from OpenSSL's reason and, on a client, the verification's
// result.
std::string handshake_failure(SSL* ssl, bool server, int ssl_error, int sys_errno) {
    unsigned long e = ERR_peek_error();
    int reason = ERR_GET_REASON(e);
    std::string why = e ? openssl_error() : std::string();
    if (!server && SSL_get_verify_result(ssl) != X509_V_OK) {
        long v = SSL_get_verify_result(ssl);
        std::string text = X509_verify_cert_error_string(v);
        if (v == X509_V_ERR_HOSTNAME_MISMATCH || v == X509_V_ERR_IP_ADDRESS_MISMATCH)
            return "the server's certificate is not for this address (" + text +
                   "): connect with a name or IP address its certificate lists (subjectAltName)";
        return "the server's certificate is not trusted (" + text +
               "): is VCUDA_TLS_CA the CA that signed the server's certificate?";
    }
    if (!server && (reason == SSL_R_WRONG_VERSION_NUMBER || reason == SSL_R_PACKET_LENGTH_TOO_LONG))
        return "the server does not speak TLS (its answer is not a TLS record): it serves plain TCP; start "
               "it "
               "with --tls-cert and --tls-key, or unset VCUDA_TLS_CA to connect in plain";
    if (ssl_error == SSL_ERROR_ZERO_RETURN || (ssl_error == SSL_ERROR_SYSCALL && sys_errno == 0 && !e) ||
        reason == SSL_R_UNEXPECTED_EOF_WHILE_READING)
        return server
                   ? "the peer closed the connection during the TLS handshake"
                   : "the server closed the connection during the TLS handshake (does it serve TLS? a plain "
                     "vcuda-server or vcuda-mgmt does that)";
    if (ssl_error == SSL_ERROR_SYSCALL && why.empty()) return std::strerror(sys_errno);
    if (server && reason == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE)
        return "the client sent no certificate, and this server requires one (--tls-client-ca)";
    if (server && reason == SSL_R_CERTIFICATE_VERIFY_FAILED)
        return "the client's certificate is not signed by the --tls-client-ca CA (" + why + ")";
    if (reason == SSL_R_TLSV1_ALERT_PROTOCOL_VERSION || reason == SSL_R_UNSUPPORTED_PROTOCOL)
        return why + " (vcuda speaks TLS 1.3 only)";
    return why.empty() ? std::string("TLS handshake failed") : why;
}

// What a TLS error after the handshake means: in TLS 1.3 a server refuses a client's certificate after the
// client has finished its handshake, so the client learns it at its first read.
std::string io_failure(int ssl_error, int sys_errno) {
    unsigned long e = ERR_peek_error();
    int reason = ERR_GET_REASON(e);
    std::string why = e ? openssl_error() : std::string(std::strerror(sys_errno));
    if (reason == SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED)
        return why + ": the server requires a client certificate; set VCUDA_TLS_CERT and VCUDA_TLS_KEY";
    if (reason == SSL_R_TLSV1_ALERT_UNKNOWN_CA || reason == SSL_R_SSLV3_ALERT_BAD_CERTIFICATE)
        return why +
               ": the server does not accept this client certificate (VCUDA_TLS_CERT): it is not signed by "
               "the CA the server trusts (--tls-client-ca)";
    return why;
}

// The step an SSL_read_ex/SSL_write_ex that did not complete stands for (`err` from SSL_get_error), once the
// caller has handled what is its own.
tls_step step_after(int err) {
    switch (err) {
        case SSL_ERROR_WANT_READ:
            return {tls_status::want_read, 0, {}};
        case SSL_ERROR_WANT_WRITE:
            return {tls_status::want_write, 0, {}};
        case SSL_ERROR_ZERO_RETURN:
            return {tls_status::closed, 0, {}};
        default:
            return {tls_status::failed, 0, io_failure(err, errno)};
    }
}

}  // namespace

// ---------------------------------------------------------------- tls_context

tls_context::~tls_context() { SSL_CTX_free(ctx_); }

result<std::shared_ptr<const tls_context>, std::string> tls_context::server(const tls_files& files) {
    if (files.cert.empty() || files.key.empty())
        return unexpected{std::string("TLS needs both a certificate (--tls-cert) and its key (--tls-key)")};
    SSL_CTX* ctx = new_context(true);
    if (!ctx) return unexpected{"cannot make a TLS context: " + openssl_error()};
    std::shared_ptr<const tls_context> c(new tls_context(ctx, true, !files.ca.empty()));
    if (auto why = load_identity(ctx, files.cert, files.key); !why.empty()) return unexpected{why};
    if (!files.ca.empty()) {
        if (auto why = load_ca(ctx, files.ca); !why.empty()) return unexpected{why};
        // The CA's name goes in the certificate request, so that a client with several picks the right one.
        if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(files.ca.c_str()))
            SSL_CTX_set_client_CA_list(ctx, names);
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
    }
    return c;
}

result<std::shared_ptr<const tls_context>, std::string> tls_context::client(const tls_files& files) {
    if (files.ca.empty())
        return unexpected{std::string("a TLS client needs the CA that signed the server's certificate")};
    if (files.cert.empty() != files.key.empty())
        return unexpected{
            std::string("a client certificate needs its key, and a key its certificate (give both "
                        "VCUDA_TLS_CERT and VCUDA_TLS_KEY, or neither)")};
    SSL_CTX* ctx = new_context(false);
    if (!ctx) return unexpected{"cannot make a TLS context: " + openssl_error()};
    std::shared_ptr<const tls_context> c(new tls_context(ctx, false, false));
    if (auto why = load_ca(ctx, files.ca); !why.empty()) return unexpected{why};
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    if (!files.cert.empty())
        if (auto why = load_identity(ctx, files.cert, files.key); !why.empty()) return unexpected{why};
    return c;
}

result<std::shared_ptr<const tls_context>, std::string> tls_context::from_environment() {
    auto env = [](const char* name) {
        const char* v = std::getenv(name);
        return std::string(v ? v : "");
    };
    tls_files files{env("VCUDA_TLS_CERT"), env("VCUDA_TLS_KEY"), env("VCUDA_TLS_CA")};
    if (files.ca.empty()) {
        if (!files.cert.empty() || !files.key.empty())
            return unexpected{
                std::string("VCUDA_TLS_CERT/VCUDA_TLS_KEY are set but VCUDA_TLS_CA is not: TLS needs the CA "
                            "that signed the "
                            "server's certificate (set VCUDA_TLS_CA=FILE)")};
        return std::shared_ptr<const tls_context>();
    }
    static std::mutex mu;
    static std::tuple<std::string, std::string, std::string> made_for;
    static std::shared_ptr<const tls_context> made;
    std::lock_guard lock(mu);
    auto key = std::tie(files.cert, files.key, files.ca);
    if (made && made_for == key) return made;
    auto c = client(files);
    if (!c) return unexpected{"VCUDA_TLS_CA/VCUDA_TLS_CERT/VCUDA_TLS_KEY: " + c.error()};
    made = *c;
    made_for = key;
    return made;
}

// ---------------------------------------------------------------- tls_connection

tls_connection::~tls_connection() { SSL_free(ssl_); }

transport_result<std::unique_ptr<tls_connection>> tls_connection::handshake(int fd, const tls_context& ctx,
                                                                            std::string_view host,
                                                                            deadline until) {
    auto fail = [](transport_errc code, std::string why) {
        return unexpected{transport_error{code, "TLS: " + std::move(why)}};
    };
    ERR_clear_error();
    SSL* ssl = SSL_new(ctx.native());
    if (!ssl) return fail(transport_errc::io, openssl_error());
    std::unique_ptr<tls_connection> c(new tls_connection(ssl));
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0 || SSL_set_fd(ssl, fd) != 1)
        return fail(transport_errc::io, "cannot attach to the socket");
    if (ctx.is_server()) {
        SSL_set_accept_state(ssl);
    } else {
        SSL_set_connect_state(ssl);
        std::string h(host);
        if (is_ip_address(h)) {
            if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), h.c_str()) != 1)
                return fail(transport_errc::bad_address, h + " is not an IP address");
        } else {
            SSL_set_tlsext_host_name(ssl, h.c_str());
            SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
            if (SSL_set1_host(ssl, h.c_str()) != 1) return fail(transport_errc::bad_address, "bad host " + h);
        }
    }
    for (;;) {
        errno = 0;
        int rc = SSL_do_handshake(ssl);
        if (rc == 1) break;
        int err = SSL_get_error(ssl, rc);
        int sys = errno;
        short events = 0;
        if (err == SSL_ERROR_WANT_READ) events = POLLIN;
        if (err == SSL_ERROR_WANT_WRITE) events = POLLOUT;
        if (events == 0)
            return fail(transport_errc::protocol, handshake_failure(ssl, ctx.is_server(), err, sys));
        if (auto w = wait_for(fd, events, until); !w.empty())
            return fail(w == "timed out" ? transport_errc::timeout : transport_errc::io,
                        "handshake: " + w + (w == "timed out" ? " (is the peer speaking TLS?)" : ""));
    }
    return c;
}

tls_step tls_connection::read(void* buf, size_t n) {
    std::lock_guard lock(mu_);
    ERR_clear_error();
    size_t got = 0;
    errno = 0;
    if (SSL_read_ex(ssl_, buf, n, &got) == 1) return {tls_status::done, got, {}};
    int err = SSL_get_error(ssl_, 0);
    if (err == SSL_ERROR_SYSCALL && errno == 0 && ERR_peek_error() == 0) return {tls_status::closed, 0, {}};
    return step_after(err);
}

tls_step tls_connection::write(const void* buf, size_t n) {
    std::lock_guard lock(mu_);
    ERR_clear_error();
    size_t put = 0;
    errno = 0;
    if (SSL_write_ex(ssl_, buf, n, &put) == 1) return {tls_status::done, put, {}};
    int err = SSL_get_error(ssl_, 0);
    if (err == SSL_ERROR_SYSCALL) {
        // The peer is gone; an alert it sent before going says why (a refused client certificate).
        int sys = errno;
        ERR_clear_error();
        char scratch[256];
        size_t got = 0;
        if (SSL_read_ex(ssl_, scratch, sizeof scratch, &got) != 1 && SSL_get_error(ssl_, 0) == SSL_ERROR_SSL)
            return {tls_status::failed, 0, io_failure(SSL_ERROR_SSL, 0)};
        ERR_clear_error();
        return {tls_status::failed, 0, std::strerror(sys)};
    }
    return step_after(err);
}

std::string tls_connection::peer_subject() const {
    std::lock_guard lock(mu_);
    X509* cert = SSL_get1_peer_certificate(ssl_);
    if (!cert) return {};
    char text[256] = {};
    X509_NAME_oneline(X509_get_subject_name(cert), text, sizeof text);
    X509_free(cert);
    return text;
}

// ---------------------------------------------------------------- the server side

transport_result<void> accept_tls(frame_stream& fs, const tls_context& ctx, deadline until) {
    stream& s = fs.raw();
    // A TLS client begins with a handshake record (0x16); a plain vcuda client with a frame's magic.
    unsigned char first = 0;
    for (;;) {
        ssize_t n = ::recv(s.native_handle(), &first, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n == 1) break;
        if (n == 0) return unexpected{transport_error{transport_errc::peer_lost, "closed before TLS began"}};
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return unexpected{transport_error{transport_errc::io, std::strerror(errno)}};
        if (auto w = wait_for(s.native_handle(), POLLIN, until); !w.empty())
            return unexpected{transport_error{transport_errc::timeout, "no TLS handshake: " + w}};
    }
    if (first == (frame_magic & 0xff)) {
        const std::string why =
            "this address accepts TLS only, and the connection was plain: set VCUDA_TLS_CA to the CA that "
            "signed this server's certificate (and VCUDA_TLS_CERT/VCUDA_TLS_KEY where client certificates "
            "are required); see vcuda's README, Security";
        // (Within the caller's limits, small before authentication.) Read first: closing with its frame
        // unread would reset the connection before the answer arrives.
        [[maybe_unused]] auto f = fs.receive(until, std::chrono::seconds(2));
        send_wire_error(fs, wire_errc::auth_failed, why);
        return unexpected{transport_error{transport_errc::protocol, "a plain (not TLS) client was refused"}};
    }
    auto r = s.start_tls(ctx, {}, until);
    if (!r) {
        // The alert that says why is on its way to the client; what it sent meanwhile (its HELLO, if its
        // handshake finished first, as in TLS 1.3) would make closing now reset the connection, and the reset
        // can reach it before the alert. So: no more writes, read what comes, for a second at most.
        ::shutdown(s.native_handle(), SHUT_WR);
        deadline linger = after(std::chrono::seconds(1));
        char sink[4096];
        while (wait_for(s.native_handle(), POLLIN, linger).empty() &&
               ::recv(s.native_handle(), sink, sizeof sink, MSG_DONTWAIT) > 0) {
        }
    }
    return r;
}

}  // namespace vcuda
