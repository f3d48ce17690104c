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
    std::vector<std::vector<std::byte>> blobs;
    std::vector<std::byte> payload;
    std::string detail;
    bool connection_ok = true;
};

class raw_client {
  public:
    // Opens a session (session_id 0) or joins one with its key: as a lane, or as a connection of bulk set
    // `bulk_set`. `token`: what the server's --secret-file or manager requires to open a session.
    static std::unique_ptr<raw_client> open(const std::string& address, uint64_t session_id = 0,
                                            const std::string& key = {}, std::string* why = nullptr,
                                            uint32_t bulk_set = 0, const std::string& token = {});
    raw_reply call(op o, std::vector<uint64_t> args, std::vector<std::vector<std::byte>> blobs = {},
                   std::vector<std::byte> payload = {}, int device = 0);
    raw_reply call(uint32_t raw_op, std::vector<uint64_t> args, int device = 0);
    // A call whose frame carries file descriptor `fd` (Unix sockets), as host_register_file's does.
    raw_reply call_with_fd(op o, std::vector<uint64_t> args, int fd, int device = 0);
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
    const std::string& key() const { return key_; }
    // The 64-bit session_secret of HELLO's reply, retired (field 3, deprecated): what an old server sends.
    uint64_t legacy_secret() const { return legacy_secret_; }
    // HELLO reply's memory quota (0: the whole GPU).
    uint64_t memory_quota() const { return memory_quota_; }
    frame_stream& stream() { return fs_; }
    // From now on every frame this client sends is also appended to `sink` as the bytes it put on the wire
    // (header, metadata, payload): a recording of a real session, which the fuzzer replays mutated. nullptr
    // stops recording.
    void record(std::vector<std::vector<std::byte>>* sink) { record_ = sink; }

  private:
    bool send_frame(const outgoing_frame& f);
    std::vector<std::vector<std::byte>>* record_ = nullptr;
    explicit raw_client(frame_stream s) : fs_(std::move(s)) {}
    bool send_args(op o, const std::vector<uint64_t>& args, int device, uint32_t flags);
    frame_stream fs_;
    uint64_t session_ = 0, sequence_ = 0, features_ = 0, memory_quota_ = 0, legacy_secret_ = 0;
    std::string key_;
    uint32_t bulk_streams_ = 0;
};

// A vcuda-server child process on a private Unix socket (or 127.0.0.1 and a port the system picks), stopped
// when destroyed.
// A session key with one bit changed: a wrong key of the right length.
inline std::string altered(std::string key) {
    if (key.empty()) key.push_back('\0');
    key[0] = static_cast<char>(key[0] ^ 1);
    return key;
}

class server_process {
  public:
    enum class transport { unix_socket, tcp };
    // `max_fds` > 0: the server runs with RLIMIT_NOFILE (soft and hard) lowered to it. `listen`: the address
    // to serve instead of the private socket or 127.0.0.1:0.
    explicit server_process(std::vector<std::string> extra_args = {}, transport t = transport::unix_socket,
                            int max_fds = 0, std::string listen = {});
    // The server's exit status once it has exited by itself within `seconds` (start-up refusals), else -1.
    int wait_exit(int seconds);
    ~server_process();
    const std::string& address() const { return address_; }
    std::string log() const;
    int pid() const { return pid_; }
    // Polls the log until it holds `text` (true) or `seconds` passed.
    bool wait_for_log(const std::string& text, int seconds = 10) const;

  private:
    int pid_ = -1, exit_status_ = -1;
    std::string dir_, address_;

  public:
    const std::string& dir() const { return dir_; }
};

}  // namespace vcuda::test
