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
    // Opens a session (session_id 0) or joins one.
    static std::unique_ptr<raw_client> open(const std::string& address, uint64_t session_id = 0, uint64_t secret = 0,
                                            std::string* why = nullptr);
    raw_reply call(op o, std::vector<uint64_t> args, std::vector<std::vector<std::byte>> blobs = {},
                   std::vector<std::byte> payload = {}, int device = 0);
    raw_reply call(uint32_t raw_op, std::vector<uint64_t> args, int device = 0);
    // Sends arbitrary bytes (garbage frames).
    bool send_raw(const std::vector<std::byte>& bytes);
    // True once the server has closed the connection.
    bool closed_by_peer();
    uint64_t session_id() const { return session_; }
    uint64_t secret() const { return secret_; }

private:
    explicit raw_client(frame_stream s) : fs_(std::move(s)) {}
    frame_stream fs_;
    uint64_t session_ = 0, secret_ = 0, sequence_ = 0;
};

// A vcuda-server child process on a private Unix socket, stopped when destroyed.
class server_process {
public:
    explicit server_process(std::vector<std::string> extra_args = {});
    ~server_process();
    const std::string& address() const { return address_; }
    std::string log() const;

private:
    int pid_ = -1;
    std::string dir_, address_;
};

}  // namespace vcuda::test
