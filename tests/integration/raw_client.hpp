// A protocol-level client for tests: speaks frames directly to a vcuda-server, so tests can send what no
// well-behaved libcuda would (other sessions' pointers and handles, unknown ops, malformed arguments).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/transport.hpp"
#include "ops.hpp"

namespace vcuda::test {

struct raw_reply {
    int result = -1;
    std::vector<uint64_t> outs;
    std::vector<std::byte> payload;
    std::string detail;
    bool connection_ok = true;
};

class raw_client {
public:
    // Opens a session (session_id 0) or joins one: as a lane, or as a connection of bulk set `bulk_set`.
    static std::unique_ptr<raw_client> open(const std::string& address, uint64_t session_id = 0, uint64_t secret = 0,
                                            std::string* why = nullptr, uint32_t bulk_set = 0);
    raw_reply call(op o, std::vector<uint64_t> args, std::vector<std::vector<std::byte>> blobs = {},
                   std::vector<std::byte> payload = {}, int device = 0);
    raw_reply call(uint32_t raw_op, std::vector<uint64_t> args, int device = 0);
    // A call in two steps, for calls that wait for what the test sends elsewhere meanwhile (striped copies).
    bool send_call(op o, std::vector<uint64_t> args, int device = 0);
    // A queued call: no reply comes; a failure is reported by the next synchronous call.
    bool send_queued(op o, std::vector<uint64_t> args, int device = 0);
    raw_reply receive_reply();
    // On a bulk connection: one chunk of a striped copy.
    bool send_chunk(uint64_t transfer, uint64_t offset, const std::vector<std::byte>& bytes);
    // On a bulk connection: the next chunk the server sends; false when something else came.
    bool receive_chunk(uint64_t& transfer, uint64_t& offset, std::vector<std::byte>& bytes);
    // What HELLO's reply offered.
    uint64_t features() const { return features_; }
    uint32_t bulk_streams() const { return bulk_streams_; }
    // Sends arbitrary bytes (garbage frames).
    bool send_raw(const std::vector<std::byte>& bytes);
    // True once the server has closed the connection.
    bool closed_by_peer();
    uint64_t session_id() const { return session_; }
    uint64_t secret() const { return secret_; }

private:
    explicit raw_client(frame_stream s) : fs_(std::move(s)) {}
    bool send_args(op o, const std::vector<uint64_t>& args, int device, uint32_t flags);
    frame_stream fs_;
    uint64_t session_ = 0, secret_ = 0, sequence_ = 0, features_ = 0;
    uint32_t bulk_streams_ = 0;
};

// A vcuda-server child process on a private Unix socket (or 127.0.0.1 and a port the system picks), stopped
// when destroyed.
class server_process {
public:
    enum class transport { unix_socket, tcp };
    explicit server_process(std::vector<std::string> extra_args = {}, transport t = transport::unix_socket);
    ~server_process();
    const std::string& address() const { return address_; }
    std::string log() const;
    int pid() const { return pid_; }
    // Polls the log until it holds `text` (true) or `seconds` passed.
    bool wait_for_log(const std::string& text, int seconds = 10) const;

private:
    int pid_ = -1;
    std::string dir_, address_;
};

}  // namespace vcuda::test
