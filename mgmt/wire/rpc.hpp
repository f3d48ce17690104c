// The manager protocol on the wire: one MgmtRequest frame {method, JSON body} answered by one MgmtReply frame
// {ok, JSON body, error} with the same sequence number, over any vcuda transport (TCP or Unix socket).
// A failed call is an rpc_error: `kind` says whether the manager was reached at all, `code` is the manager's
// stable error code (mgmt/PROTOCOL.md) when it answered "no".
// runs on: any thread; one mgmt_connection is used by one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/result.hpp"
#include "common/transport.hpp"

namespace vcuda::mgmt {

enum class rpc_errc {
    unreachable,  // nothing answered at the address (refused, unresolvable, connect timeout)
    transport,    // the connection broke or timed out during the call
    bad_reply,    // the manager answered something that is not a reply to this request
    remote,       // the manager refused the request: see code and message
};

struct rpc_error {
    rpc_errc kind = rpc_errc::transport;
    std::string code;  // for remote: bad_request, unknown_method, unauthenticated, forbidden, unknown_server,
                       // unknown_lease, no_capacity, not_found, internal
    std::string message;  // human-readable, says what to do next where it can
};

class mgmt_connection {
  public:
    static result<mgmt_connection, rpc_error> connect(const endpoint& manager,
                                                      std::chrono::milliseconds timeout);

    // Sends `method` with a JSON body (an object, "{}" when empty) and returns the reply's JSON body. `auth`
    // is the caller's credential or shared-secret signature (mgmt/PROTOCOL.md, "Authentication").
    result<std::string, rpc_error> call(std::string_view method, std::string_view body,
                                        std::chrono::milliseconds timeout, std::string_view auth = {});
    bool is_open() { return stream_ && stream_->raw().is_open(); }
    const endpoint& peer() const { return peer_; }

    mgmt_connection(mgmt_connection&&) noexcept = default;
    mgmt_connection& operator=(mgmt_connection&&) noexcept = default;
    ~mgmt_connection();

  private:
    mgmt_connection() = default;
    endpoint peer_;
    std::unique_ptr<frame_stream> stream_;  // frame_stream holds a mutex, so it is not movable itself
    uint64_t next_sequence_ = 1;
};

// Connects, calls once, disconnects.
result<std::string, rpc_error> mgmt_call(const endpoint& manager, std::string_view method,
                                         std::string_view body, std::chrono::milliseconds timeout,
                                         std::string_view auth = {});

// "cannot reach the manager at X: ... is vcuda-mgmt running? ..." for unreachable/transport errors; the
// manager's own message for remote ones.
std::string describe(const rpc_error& e, const endpoint& manager);

}  // namespace vcuda::mgmt
