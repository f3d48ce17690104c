// Striped copies over TCP on loopback (protocol/README.md, *Bulk connections*): vcuda's libcuda
// (bulk_client.cpp) against a vcuda-server on the software driver, every byte checked; and the protocol's
// refusals, spoken directly (raw_client): a wrong secret, a chunk outside its copy or of no copy, a bulk
// connection lost during a copy, a client killed during copies.
#include <catch2/catch.hpp>

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "raw_client.hpp"

using namespace vcuda;
using namespace vcuda::test;

namespace {

using tcp = server_process;
constexpr auto over_tcp = server_process::transport::tcp;

std::vector<std::byte> pattern(size_t n, uint8_t seed) {
    std::vector<std::byte> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed + (i >> 12)) & 0xff);
    return v;
}

uint64_t alloc(raw_client& c, uint64_t size) {
    auto r = c.call(op::mem_alloc, {size});
    REQUIRE(r.result == CUDA_SUCCESS);
    return r.outs.at(0);
}

std::string read_file(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// bulk_client (bulk_client.cpp) run against `server`, with `env` ("NAME=VALUE") added; its output in a file.
class client_process {
  public:
    client_process(const std::string& server, std::vector<std::string> env, std::vector<std::string> args) {
        char tmpl[] = "/tmp/vcuda-bulk-XXXXXX";
        int fd = mkstemp(tmpl);
        out_ = tmpl;
        pid_ = fork();
        if (pid_ == 0) {
            dup2(fd, 1);
            dup2(fd, 2);
            setenv("VCUDA_SERVER", server.c_str(), 1);
            for (auto& e : env) putenv(e.data());
            args.insert(args.begin(), VCUDA_BULK_CLIENT);
            std::vector<char*> argv;
            for (auto& a : args) argv.push_back(a.data());
            argv.push_back(nullptr);
            execv(argv[0], argv.data());
            _exit(127);
        }
        close(fd);
    }
    ~client_process() {
        if (pid_ > 0) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
        unlink(out_.c_str());
    }
    // The exit status (killed after `seconds`: -1).
    int wait(int seconds = 180) {
        for (int i = 0; i < seconds * 50; ++i) {
            int status = 0;
            if (waitpid(pid_, &status, WNOHANG) == pid_) {
                pid_ = -1;
                return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        return -1;
    }
    bool wait_for_output(const std::string& text, int seconds = 30) const {
        for (int i = 0; i < seconds * 50; ++i) {
            if (output().find(text) != std::string::npos) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        return false;
    }
    void kill_now() {
        kill(pid_, SIGKILL);
        waitpid(pid_, nullptr, 0);
        pid_ = -1;
    }
    std::string output() const { return read_file(out_); }

  private:
    int pid_ = -1;
    std::string out_;
};

// What the server logged of the bulk connections that ended (server/bulk.cpp: leave()).
struct bulk_log {
    int connections = 0;
    uint64_t chunks_in = 0, chunks_out = 0, buffers = 0, most_buffers = 0;
    bool every_connection_reused_its_buffers = true;
};

bulk_log read_bulk_log(const std::string& log) {
    static const std::regex line(
        R"(bulk connection \d+ \(set \d+\) ended .*: (\d+) chunks in, (\d+) out, (\d+) staging buffers)");
    bulk_log r;
    for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator(); ++it) {
        uint64_t in = std::stoull((*it)[1]), out = std::stoull((*it)[2]), buffers = std::stoull((*it)[3]);
        ++r.connections;
        r.chunks_in += in;
        r.chunks_out += out;
        r.buffers += buffers;
        r.most_buffers = std::max(r.most_buffers, buffers);
        if (in + out <= buffers) r.every_connection_reused_its_buffers = false;
    }
    return r;
}

// Waits until the log tells of `sessions` ended sessions.
bool sessions_ended(const server_process& server, size_t sessions) {
    for (int i = 0; i < 500; ++i) {
        std::string log = server.log();
        size_t n = 0;
        for (size_t at = log.find("MiB of GPU memory"); at != std::string::npos;
             at = log.find("MiB of GPU memory", at + 1))
            ++n;
        if (n >= sessions) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
}

// Runs `verify` of bulk_client with VCUDA_BULK_STREAMS=`streams` (empty: unset) and returns the server's log
// once its session ended (the server's `earlier`-th+1).
std::string verify_copies(server_process& server, const std::string& streams, size_t earlier = 0) {
    std::vector<std::string> env;
    if (!streams.empty()) env.push_back("VCUDA_BULK_STREAMS=" + streams);
    client_process client(server.address(), env,
                          {"verify", std::to_string((16u << 20) + 13), std::to_string(100u << 20)});
    int rc = client.wait();
    INFO(client.output());
    REQUIRE(rc == 0);
    REQUIRE(client.output().find("PASS verify") != std::string::npos);
    REQUIRE(sessions_ended(server, earlier + 1));  // after its connections' ends
    return server.log();
}

long proc_status(int pid, const std::string& key) {
    std::istringstream in(read_file("/proc/" + std::to_string(pid) + "/status"));
    std::string line;
    while (std::getline(in, line))
        if (line.rfind(key + ":", 0) == 0) return std::stol(line.substr(key.size() + 1));
    return -1;
}

// A server on TCP, a session with one lane and `size` bytes of device memory at `p`, and its bulk
// connections.
struct striped_session {
    static constexpr uint64_t n = 1 << 20;  // the chunk size of the tests' copies
    tcp server{{}, over_tcp};
    std::unique_ptr<raw_client> lane;
    uint64_t p = 0;

    explicit striped_session(uint64_t size) {
        lane = raw_client::open(server.address());
        REQUIRE(lane);
        p = alloc(*lane, size);
    }
    std::unique_ptr<raw_client> bulk(uint32_t set) {
        auto b = raw_client::open(server.address(), lane->session_id(), lane->key(), nullptr, set);
        REQUIRE(b);
        return b;
    }
    // copy_htod_striped's arguments {dst, size, stream, transfer, chunk, set}, sent without waiting.
    void send_htod(uint64_t dst, uint64_t size, uint64_t transfer, uint32_t set) {
        REQUIRE(lane->send_call(op::copy_htod_striped, {dst, size, 0, transfer, n, set}));
    }
};

std::vector<std::byte> slice(const std::vector<std::byte>& v, uint64_t from, uint64_t to) {
    return std::vector<std::byte>(v.begin() + from, v.begin() + to);
}

}  // namespace

TEST_CASE("striped copies over TCP carry every byte with 4 bulk connections through reused staging buffers",
          "[integration]") {
    tcp server({}, over_tcp);
    auto log = read_bulk_log(verify_copies(server, "4"));
    CHECK(log.connections == 4);
    CHECK(log.chunks_in > 0);
    CHECK(log.chunks_out > 0);
    CHECK(log.most_buffers <= 6);  // per connection (4 to receive, 2 to send), however many chunks it carried
    CHECK(log.every_connection_reused_its_buffers);
}

TEST_CASE("striped copies over TCP carry every byte with 1 bulk connection", "[integration]") {
    tcp server({}, over_tcp);
    auto log = read_bulk_log(verify_copies(server, "1"));
    CHECK(log.connections == 1);
    CHECK(log.chunks_in > 0);
    CHECK(log.chunks_out > 0);
    CHECK(log.every_connection_reused_its_buffers);
}

TEST_CASE("with striping off on either side large copies travel on their lane", "[integration]") {
    SECTION("VCUDA_BULK_STREAMS=0") {
        tcp server({}, over_tcp);
        CHECK(read_bulk_log(verify_copies(server, "0")).connections == 0);
    }
    SECTION("vcuda-server --bulk-streams 0") {
        tcp server({"--bulk-streams", "0"}, over_tcp);
        auto lane = raw_client::open(server.address());
        REQUIRE(lane);
        CHECK((lane->features() & features::bulk) == 0);
        std::string why;
        CHECK(!raw_client::open(server.address(), lane->session_id(), lane->key(), &why, 1));
        CHECK(why.find("bulk") != std::string::npos);
        lane.reset();
        REQUIRE(sessions_ended(server, 1));
        CHECK(read_bulk_log(verify_copies(server, "", 1)).connections == 0);
    }
}

TEST_CASE("a bulk connection must name its session's secret", "[integration]") {
    tcp server({}, over_tcp);
    auto lane = raw_client::open(server.address());
    REQUIRE(lane);
    CHECK(lane->features() & features::bulk);
    CHECK(lane->bulk_streams() == 8);
    std::string why;
    CHECK(!raw_client::open(server.address(), lane->session_id(), altered(lane->key()), &why, 1));
    CHECK(why.find("secret") != std::string::npos);
    CHECK(!raw_client::open(server.address(), 0, {}, &why, 1));  // no session to join
    CHECK(raw_client::open(server.address(), lane->session_id(), lane->key(), &why, 1));
}

TEST_CASE("a chunk that does not fit its copy fails that copy, and the session and its bulk connection go on",
          "[integration]") {
    const uint64_t n = striped_session::n;
    striped_session s(2 * n);
    auto bulk = s.bulk(1);
    auto data = pattern(2 * n, 5);
    auto half = slice(data, 0, n);

    // Copy 1: its chunk lies past its end.
    s.send_htod(s.p, n, 1, 1);
    REQUIRE(bulk->send_chunk(1, 4 * n, half));
    auto r = s.lane->receive_reply();
    CHECK(r.result == CUDA_ERROR_INVALID_VALUE);
    CHECK(r.detail.find("outside") != std::string::npos);
    // Copy 2: a chunk shorter than its place.
    s.send_htod(s.p, n, 2, 1);
    REQUIRE(bulk->send_chunk(2, 0, slice(data, 0, 100)));
    r = s.lane->receive_reply();
    CHECK(r.result == CUDA_ERROR_INVALID_VALUE);
    // Copy 3 into memory the session does not own: refused, its chunk still taken.
    s.send_htod(s.p + 64 * n, n, 3, 1);
    REQUIRE(bulk->send_chunk(3, 0, half));
    CHECK(s.lane->receive_reply().result == CUDA_ERROR_INVALID_VALUE);

    // Copy 4, two chunks, one of them before the call: the bytes land.
    REQUIRE(bulk->send_chunk(4, n, slice(data, n, 2 * n)));
    s.send_htod(s.p, 2 * n, 4, 1);
    REQUIRE(bulk->send_chunk(4, 0, half));
    CHECK(s.lane->receive_reply().result == CUDA_SUCCESS);
    auto back = s.lane->call(op::copy_dtoh, {s.p, 2 * n, 0});
    REQUIRE(back.result == CUDA_SUCCESS);
    CHECK(back.payload == data);
}

TEST_CASE("a chunk of no copy under way closes its bulk set, and the lanes go on", "[integration]") {
    const uint64_t n = striped_session::n;
    striped_session s(n);
    auto bulk = s.bulk(1);
    auto data = pattern(n, 9);
    s.send_htod(s.p, n, 1, 1);
    REQUIRE(bulk->send_chunk(1, 0, data));
    REQUIRE(s.lane->receive_reply().result == CUDA_SUCCESS);
    // Transfer 1 is over: another chunk for it is refused and the connection closed.
    REQUIRE(bulk->send_chunk(1, 0, data));
    CHECK(bulk->closed_by_peer());
    CHECK(s.server.wait_for_log("not under way"));
    // Set 1 is gone: a striped copy on it fails at once; the lane goes on.
    s.send_htod(s.p, n, 2, 1);
    CHECK(s.lane->receive_reply().result == CUDA_ERROR_DEVICE_UNAVAILABLE);
    CHECK(s.lane->call(op::mem_get_info, {}).result == CUDA_SUCCESS);
    // A new set serves.
    auto again = s.bulk(2);
    s.send_htod(s.p, n, 3, 2);
    REQUIRE(again->send_chunk(3, 0, data));
    CHECK(s.lane->receive_reply().result == CUDA_SUCCESS);
}

TEST_CASE("chunks waiting for a later call never starve a device-to-host copy before it", "[integration]") {
    const uint64_t n = striped_session::n;
    striped_session s(8 * n);
    auto data = pattern(8 * n, 3);
    REQUIRE(s.lane->call(op::copy_htod, {s.p, 0}, {}, data).result == CUDA_SUCCESS);
    auto bulk = s.bulk(1);
    // Transfer 2's chunks come first and take every receive buffer of the connection (and wait in its
    // socket).
    for (uint64_t i = 0; i < 6; ++i) REQUIRE(bulk->send_chunk(2, i * n, slice(data, i * n, (i + 1) * n)));
    // Transfer 1, device to host, runs first: its chunks come back on the same connection, in any order.
    REQUIRE(s.lane->send_call(op::copy_dtoh_striped, {s.p, 8 * n, 0, 1, n, 1}));
    std::vector<std::byte> got(8 * n);
    for (int i = 0; i < 8; ++i) {
        uint64_t transfer = 0, offset = 0;
        std::vector<std::byte> bytes;
        REQUIRE(bulk->receive_chunk(transfer, offset, bytes));
        CHECK(transfer == 1);
        REQUIRE(offset + bytes.size() <= got.size());
        std::copy(bytes.begin(), bytes.end(), got.begin() + offset);
    }
    CHECK(s.lane->receive_reply().result == CUDA_SUCCESS);
    CHECK(got == data);
    // Then transfer 2 takes its waiting chunks: the first 6 MiB of the data, now at p + 1 MiB.
    s.send_htod(s.p + n, 6 * n, 2, 1);
    CHECK(s.lane->receive_reply().result == CUDA_SUCCESS);
    auto back = s.lane->call(op::copy_dtoh, {s.p + n, 6 * n, 0});
    CHECK(back.payload == slice(data, 0, 6 * n));
}

TEST_CASE("a bulk connection lost during a copy fails the copy but not the lane", "[integration]") {
    const uint64_t n = striped_session::n;
    striped_session s(2 * n);
    auto a = s.bulk(1);
    auto b = s.bulk(1);
    s.send_htod(s.p, 2 * n, 1, 1);
    REQUIRE(a->send_chunk(1, 0, pattern(n, 1)));
    b.reset();  // gone before its chunk
    auto r = s.lane->receive_reply();
    INFO(s.server.log());
    INFO(r.detail);
    CHECK(r.result == CUDA_ERROR_DEVICE_UNAVAILABLE);
    CHECK(r.detail.find("lost") != std::string::npos);
    CHECK(s.lane->call(op::mem_get_info, {}).result == CUDA_SUCCESS);
    CHECK(a->closed_by_peer());  // its set went with it
}

TEST_CASE("a client killed during striped copies: the server releases everything and serves on",
          "[integration]") {
    tcp server({}, over_tcp);
    {  // a first session, so that whatever the driver starts once is running before the count
        auto warm = raw_client::open(server.address());
        REQUIRE(warm);
        alloc(*warm, 1 << 20);
    }
    REQUIRE(sessions_ended(server, 1));
    // The first session's connection threads may still be on their way out after its end is logged: the
    // baseline is the count once it has held still for 200 ms.
    long threads = proc_status(server.pid(), "Threads");
    for (int still = 0, i = 0; still < 10 && i < 250; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        long now = proc_status(server.pid(), "Threads");
        still = now == threads ? still + 1 : 0;
        threads = now;
    }
    const long rss = proc_status(server.pid(), "VmRSS");
    {
        client_process client(server.address(), {"VCUDA_BULK_STREAMS=4"},
                              {"loop", std::to_string(64u << 20)});
        REQUIRE(client.wait_for_output("looping"));
        std::this_thread::sleep_for(std::chrono::milliseconds(150));
        client.kill_now();
    }
    INFO(server.log());
    REQUIRE(sessions_ended(server, 2));
    CHECK(server.log().find("released 64 MiB") != std::string::npos);
    CHECK(read_bulk_log(server.log()).connections == 4);
    // Every thread the session had ended, and its memory (device memory and staging buffers) is back.
    bool back = false;
    for (int i = 0; i < 250 && !back; ++i) {
        back = proc_status(server.pid(), "Threads") <= threads;
        if (!back) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    CHECK(back);
#ifndef VCUDA_SANITIZED  // sanitizers keep shadow memory for what the copies touched
    CHECK(proc_status(server.pid(), "VmRSS") < rss + (32 << 10));  // kB
#endif
    auto next = raw_client::open(server.address());
    REQUIRE(next);
    alloc(*next, 1 << 20);
}
