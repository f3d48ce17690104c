// Issue 17 (hardening), each finding as a test against a vcuda-server process on the software driver: session
// secrets from the CSPRNG, authentication on every listener, lease tokens bound to their lease, bounds on
// what an unauthenticated peer can make the server hold, and sessions that end when their client is gone.
#include <catch2/catch.hpp>

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/handle_kind.hpp"
#include "common/wire.hpp"
#include "mgmt/token.hpp"
#include "mgmt/wire/lease.hpp"
#include "mgmt/wire/rpc.hpp"
#include "raw_client.hpp"

using namespace vcuda;
using namespace vcuda::test;
using namespace std::chrono_literals;

namespace {

// ---------------------------------------------------------------- helpers

std::string temp_secret_file(const std::string& secret) {
    char tmpl[] = "/tmp/vcuda-secret-XXXXXX";
    int fd = mkstemp(tmpl);
    REQUIRE(fd >= 0);
    std::string text = secret + "\n";
    REQUIRE(write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
    close(fd);
    chmod(tmpl, 0600);
    return tmpl;
}

std::string run_command(const std::string& cmd, int* status = nullptr) {
    std::string out;
    FILE* p = popen((cmd + " 2>&1").c_str(), "r");
    REQUIRE(p);
    char buf[512];
    while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    int st = pclose(p);
    if (status) *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    return out;
}

// The software driver's GPU 0 as the server names it (tests/softdriver/soft_device.cpp).
std::string soft_gpu0_uuid() {
    const unsigned char b[16] = {'v', 'c', 'u', 'd', 'a', '-', 's', 'o', 'f', 't', '-', 'g', 'p', 0, 0, 0};
    char s[64];
    std::snprintf(s, sizeof s, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                  b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
                  b[14], b[15]);
    return s;
}

std::string lease_token(const std::string& secret, const std::string& lease, uint64_t quota,
                        std::chrono::seconds life = std::chrono::seconds(600)) {
    return mgmt::sign_token(secret,
                            {lease, soft_gpu0_uuid(), quota, std::chrono::system_clock::now() + life});
}

long proc_number(int pid, const std::string& file, const std::string& key) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/" + file);
    for (std::string line; std::getline(in, line);)
        if (line.rfind(key, 0) == 0) return std::strtol(line.c_str() + key.size(), nullptr, 10);
    return -1;
}
long rss_kib(int pid) { return proc_number(pid, "status", "VmRSS:"); }
long thread_count(int pid) { return proc_number(pid, "status", "Threads:"); }

// utime + stime of a process, in clock ticks.
long cpu_ticks(int pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::istringstream rest(all.substr(all.rfind(')') + 2));
    std::string field;
    long utime = 0, stime = 0;
    for (int i = 3; rest >> field; ++i) {
        if (i == 14) utime = std::stol(field);
        if (i == 15) {
            stime = std::stol(field);
            break;
        }
    }
    return utime + stime;
}

// ---- MT19937-64 (std::mt19937_64): is a sequence of (id, secret) pairs the generator's consecutive outputs?
constexpr uint64_t mt_a = 0xB5026F5AA96619E9ull, mt_upper = 0xFFFFFFFF80000000ull, mt_lower = 0x7FFFFFFFull;

uint64_t untemper(uint64_t y) {
    y ^= y >> 43;
    y ^= (y << 37) & 0xFFF7EEE000000000ull;
    uint64_t x = y;
    for (int i = 0; i < 4; ++i) x = y ^ ((x << 17) & 0x71D67FFFEDA60000ull);
    y = x;
    for (int i = 0; i < 3; ++i) x = y ^ ((x >> 29) & 0x5555555555555555ull);
    return x;
}

// Outputs o[k] of the generator satisfy state[k+312] = state[k+156] ^ twist(state[k], state[k+1]). The server
// drew an id (top bit cleared) and then a secret for each session: a secret 156 sessions later follows from
// three earlier values. True when any such prediction comes true (2^-63 by chance per try).
bool looks_like_mt19937(const std::vector<std::pair<uint64_t, uint64_t>>& pairs) {
    auto twist = [](uint64_t hi, uint64_t lo) {
        uint64_t y = (hi & mt_upper) | (lo & mt_lower);
        return (y >> 1) ^ ((y & 1) ? mt_a : 0);
    };
    for (size_t j = 0; j + 156 < pairs.size(); ++j) {
        uint64_t s_j = untemper(pairs[j].second), s_mid = untemper(pairs[j + 78].second);
        uint64_t want = untemper(pairs[j + 156].second);
        for (uint64_t top : {uint64_t{0}, uint64_t{1} << 63}) {
            uint64_t next_id = untemper(pairs[j + 1].first | top);
            if ((s_mid ^ twist(s_j, next_id)) == want) return true;
        }
    }
    return false;
}

uint64_t first_word(const std::string& key) {
    uint64_t v = 0;
    std::memcpy(&v, key.data(), std::min(key.size(), sizeof v));
    return v;
}

// Opens (or joins) until the server has counted a connection that just closed: refusals at a limit are
// checked for each attempt's message.
std::unique_ptr<raw_client> open_retrying(const std::string& address, uint64_t session = 0,
                                          const std::string& key = {}) {
    for (int i = 0; i < 50; ++i) {
        if (auto c = raw_client::open(address, session, key)) return c;
        std::this_thread::sleep_for(50ms);
    }
    return nullptr;
}

bool ended_within(const server_process& s, uint64_t session, std::chrono::milliseconds limit) {
    auto until = std::chrono::steady_clock::now() + limit;
    std::string line = "session " + std::to_string(session) + " ended";
    while (std::chrono::steady_clock::now() < until) {
        if (s.log().find(line) != std::string::npos) return true;
        std::this_thread::sleep_for(20ms);
    }
    return s.log().find(line) != std::string::npos;
}

// A CALL that the server must run only after lane `after_lane` has run its call `after_seq`.
void send_ordered_call(raw_client& c, op o, uint32_t after_lane, uint64_t after_seq) {
    flatbuffers::FlatBufferBuilder b;
    auto args = b.CreateVector(std::vector<uint64_t>{});
    b.Finish(wire::CreateCall(b, static_cast<uint32_t>(o), 0, args, 0, after_lane, after_seq));
    REQUIRE(c.stream().send(make_frame(frame_kind::call, b, 1)));
}

}  // namespace

// ---------------------------------------------------------------- 1. session ids and keys

TEST_CASE("the detector of std::mt19937_64 sequences finds one", "[unit]") {
    std::mt19937_64 rng(12345);
    std::vector<std::pair<uint64_t, uint64_t>> pairs;
    for (int i = 0; i < 170; ++i) {
        uint64_t id = rng() & 0x7fffffffffffffffull;
        pairs.emplace_back(id, rng());
    }
    CHECK(looks_like_mt19937(pairs));
    std::random_device rd;
    std::vector<std::pair<uint64_t, uint64_t>> other;
    other.reserve(170);
    for (int i = 0; i < 170; ++i) other.emplace_back(rng() >> 1, (uint64_t(rd()) << 32) | rd());
    CHECK_FALSE(looks_like_mt19937(other));
}

TEST_CASE("session ids and keys are unpredictable: 256-bit keys from the CSPRNG, not a seeded generator",
          "[integration]") {
    server_process server;
    std::vector<std::pair<uint64_t, uint64_t>> pairs;
    std::set<uint64_t> ids;
    std::set<std::string> keys;
    std::string key_or(32, '\0'), key_and(32, '\xff');
    uint64_t id_or = 0, id_and = ~uint64_t{0};
    for (int i = 0; i < 170; ++i) {
        std::string why;
        auto c = raw_client::open(server.address(), 0, {}, &why);
        REQUIRE(c);
        const std::string& k = c->key();
        pairs.emplace_back(c->session_id(), k.size() >= 8 ? first_word(k) : c->legacy_secret());
        ids.insert(c->session_id());
        keys.insert(k);
        id_or |= c->session_id();
        id_and &= c->session_id();
        for (size_t b = 0; b < std::min<size_t>(k.size(), 32); ++b) {
            key_or[b] = static_cast<char>(key_or[b] | k[b]);
            key_and[b] = static_cast<char>(key_and[b] & k[b]);
        }
    }
    // The old server's 64-bit secrets were consecutive outputs of a 32-bit-seeded std::mt19937_64: a client
    // that opened 160 sessions could compute the next tenant's.
    CHECK_FALSE(looks_like_mt19937(pairs));
    REQUIRE(pairs.front().second != 0);
    CHECK(ids.size() == 170);
    CHECK(keys.size() == 170);
    // Every bit of the 63-bit id and the 256-bit key is used (each is set and clear in some of 170 sessions).
    CHECK(id_or == 0x7fffffffffffffffull);
    CHECK(id_and == 0);
    for (auto& k : keys) CHECK(k.size() == 32);
    CHECK(key_or == std::string(32, '\xff'));
    CHECK(key_and == std::string(32, '\0'));
}

TEST_CASE("joining a session needs its key", "[integration]") {
    server_process server;
    auto a = raw_client::open(server.address());
    REQUIRE(a);
    REQUIRE(a->key().size() >= 16);
    std::string why;
    CHECK(!raw_client::open(server.address(), a->session_id(), altered(a->key()), &why));
    CHECK(why.find("secret") != std::string::npos);
    CHECK(!raw_client::open(server.address(), a->session_id(), {}, &why));
    CHECK(!raw_client::open(server.address(), a->session_id(), a->key().substr(0, 8), &why));
    auto lane = raw_client::open(server.address(), a->session_id(), a->key(), &why);
    REQUIRE(lane);
    CHECK(lane->session_id() == a->session_id());
    CHECK(lane->call(op::mem_alloc, {4096}).result == CUDA_SUCCESS);
}

// ---------------------------------------------------------------- 2. authentication on every listener

TEST_CASE("a server with --secret-file serves only clients with a token signed with it", "[integration]") {
    const std::string secret = "standalone-secret-0123456789abcdef";
    std::string file = temp_secret_file(secret);
    server_process server({"--secret-file", file}, server_process::transport::tcp);
    std::string why;
    CHECK(!raw_client::open(server.address(), 0, {}, &why));
    CHECK(why.find("requires a token") != std::string::npos);
    CHECK(why.find("vcuda token create") != std::string::npos);

    // A token made by the command line with another secret, and a forged one: refused.
    std::string other = temp_secret_file("another-secret-0123456789abcdef");
    std::string wrong = run_command(std::string(VCUDA_CLI_BIN) + " token create --secret-file " + other);
    REQUIRE(wrong.rfind("vct1.", 0) == 0);
    CHECK(!raw_client::open(server.address(), 0, {}, &why, 0, wrong));
    CHECK(why.find("bad token signature") != std::string::npos);
    CHECK(!raw_client::open(server.address(), 0, {}, &why, 0, "vct1.forged.token"));
    // Expired: refused.
    std::string old = mgmt::sign_token(secret, {"", "*", 0, std::chrono::system_clock::now() - 1s});
    CHECK(!raw_client::open(server.address(), 0, {}, &why, 0, old));
    CHECK(why.find("expired") != std::string::npos);

    // The right one opens sessions; its --memory is the session's quota.
    int status = -1;
    std::string good = run_command(
        std::string(VCUDA_CLI_BIN) + " token create --secret-file " + file + " --ttl 1h --memory 64M",
        &status);
    REQUIRE(status == 0);
    auto c = raw_client::open(server.address(), 0, {}, &why, 0, good);
    REQUIRE(c);
    CHECK(c->memory_quota() == 64u << 20);
    CHECK(c->call(op::mem_alloc, {1u << 20}).result == CUDA_SUCCESS);
    CHECK(c->call(op::mem_alloc, {128u << 20}).result == CUDA_ERROR_OUT_OF_MEMORY);
    auto d =
        raw_client::open(server.address(), 0, {}, &why, 0, good);  // a shared token: more than one session
    CHECK(d);
    // A lane joins with the session's key (no token needed: the key is the proof).
    CHECK(raw_client::open(server.address(), c->session_id(), c->key(), &why));
    unlink(file.c_str());
    unlink(other.c_str());
}

TEST_CASE("a network address without a secret is refused at start unless --insecure", "[integration]") {
    {
        server_process server({}, server_process::transport::tcp, 0, "0.0.0.0:0");
        CHECK(server.wait_exit(15) == 2);
        CHECK(server.log().find("refusing to serve a network address without authentication") !=
              std::string::npos);
    }
    {
        server_process server({"--insecure"}, server_process::transport::tcp, 0, "0.0.0.0:0");
        CHECK(server.wait_for_log("GPU(s) on 0.0.0.0:"));
        CHECK(server.log().find("with --insecure: no authentication") != std::string::npos);
        CHECK(server.wait_exit(1) == -1);  // still running
    }
    // Loopback and Unix sockets need no secret (same host: the socket's mode and --allow-uid guard those).
    server_process loopback({}, server_process::transport::tcp);
    CHECK(raw_client::open(loopback.address()));
}

TEST_CASE("a Unix socket is made with mode 0660 and admits only the uids of --allow-uid", "[integration]") {
    {
        server_process server;
        struct stat st {};
        REQUIRE(stat(server.address().substr(5).c_str(), &st) == 0);
        CHECK((st.st_mode & 0777) == 0660);
    }
    {
        server_process server(
            {"--allow-uid", std::to_string(getuid() + 1) + "," + std::to_string(getuid() + 2)});
        std::string why;
        CHECK(!raw_client::open(server.address(), 0, {}, &why));
        CHECK(why.find("uid " + std::to_string(getuid())) != std::string::npos);
        CHECK(why.find("--allow-uid") != std::string::npos);
    }
    {
        server_process server({"--allow-uid", std::to_string(getuid() + 1) + "," + std::to_string(getuid())});
        CHECK(raw_client::open(server.address()));
    }
}

// ---------------------------------------------------------------- 3. lease tokens

TEST_CASE("a lease token opens one session per GPU of its lease, with the lease's quota", "[integration]") {
    const std::string secret = "manager-secret-0123456789abcdef";
    std::string file = temp_secret_file(secret);
    // The manager is not there: the server still checks tokens (its agent keeps trying to register).
    server_process server({"--manager", "unix:/nonexistent/vcuda-mgmt.sock", "--secret-file", file});
    std::string token = lease_token(secret, "lease-one", 64u << 20);
    std::string why;
    auto a = raw_client::open(server.address(), 0, {}, &why, 0, token);
    REQUIRE(a);
    CHECK(a->memory_quota() == 64u << 20);  // the lease's, not 0
    uint64_t first = a->session_id();
    CHECK(!raw_client::open(server.address(), 0, {}, &why, 0, token));
    CHECK(why.find("one session per GPU") != std::string::npos);
    // A standalone token (`vcuda token create`) opens nothing on a managed server.
    std::string any = mgmt::sign_token(secret, {"", "*", 0, std::chrono::system_clock::now() + 1h});
    CHECK(!raw_client::open(server.address(), 0, {}, &why, 0, any));
    CHECK(why.find("lease tokens only") != std::string::npos);
    // Another lease's token opens its own session; once the first session ends its token may open one again.
    CHECK(raw_client::open(server.address(), 0, {}, &why, 0, lease_token(secret, "lease-two", 64u << 20)));
    a.reset();
    REQUIRE(ended_within(server, first, 5s));
    CHECK(raw_client::open(server.address(), 0, {}, &why, 0, token));
    unlink(file.c_str());
}

TEST_CASE("a released lease's token opens no session", "[integration]") {
    const std::string secret = "manager-secret-0123456789abcdef";
    std::string file = temp_secret_file(secret);
    char tmpl[] = "/tmp/vcuda-mgr-XXXXXX";
    std::string dir = mkdtemp(tmpl);
    std::string msock = dir + "/m.sock";
    pid_t mgr = fork();
    if (mgr == 0) {
        freopen((dir + "/mgmt.log").c_str(), "w", stderr);
        execl(VCUDA_MGMT_BIN, VCUDA_MGMT_BIN, "--listen", ("unix:" + msock).c_str(), "--db",
              (dir + "/m.db").c_str(), "--secret-file", file.c_str(), "--heartbeat-timeout", "1s",
              "--log-level", "debug", nullptr);
        _exit(127);
    }
    for (int i = 0; i < 250 && access(msock.c_str(), F_OK) != 0; ++i) std::this_thread::sleep_for(20ms);
    {
        server_process server(
            {"--manager", "unix:" + msock, "--secret-file", file, "--advertise", "unix:/unused"});
        REQUIRE(server.wait_for_log("registered with the manager"));
        auto manager = endpoint::parse("unix:" + msock);
        REQUIRE(manager);
        mgmt::lease_request req;
        req.client_host = "test";
        req.memory_per_gpu = 32u << 20;
        // The server registers its endpoints from --listen; this test connects to its socket itself.
        // The client is a tenant with a credential, made by an operator who holds the secret file.
        const std::string create = R"({"tenant":"test"})";
        auto made = mgmt::mgmt_call(*manager, "tokens.create", create, 5s,
                                    mgmt::sign_request(secret, "tokens.create", create));
        REQUIRE(made);
        const std::string credential = nlohmann::json::parse(*made).at("credential").get<std::string>();
        auto grant = mgmt::acquire_lease(*manager, req, 5s, credential);
        REQUIRE(grant);
        REQUIRE(grant->devices.size() == 1);
        const std::string token = grant->devices[0].token;
        std::string why;
        auto a = raw_client::open(server.address(), 0, {}, &why, 0, token);
        REQUIRE(a);
        CHECK(a->memory_quota() == 32u << 20);
        uint64_t id = a->session_id();
        auto r = mgmt::mgmt_call(*manager, "lease.release",
                                 nlohmann::json{{"lease_id", grant->lease_id}}.dump(), 5s, credential);
        REQUIRE(r);
        // The server learns it at the next heartbeat (every ~0.3 s here): the session ends, the token is
        // dead.
        CHECK(ended_within(server, id, 5s));
        CHECK(!raw_client::open(server.address(), 0, {}, &why, 0, token));
        CHECK(why.find("was released or has expired") != std::string::npos);
    }
    kill(mgr, SIGTERM);
    waitpid(mgr, nullptr, 0);
    unlink(file.c_str());
}

// ---------------------------------------------------------------- 4. bounded resources

TEST_CASE("a HELLO announcing a 1 GiB payload is refused before anything is allocated", "[integration]") {
    server_process server;
    auto probe = raw_client::open(server.address());  // the server is up and has served once
    REQUIRE(probe);
    long before = rss_kib(server.pid());
    REQUIRE(before > 0);
    std::vector<std::unique_ptr<raw_client>> held;
    for (int i = 0; i < 3; ++i) {
        auto ep = endpoint::parse(server.address());
        auto s = stream::connect(*ep, 5s);
        REQUIRE(s);
        flatbuffers::FlatBufferBuilder b;
        b.Finish(wire::CreateHello(b, protocol_version, features::all, b.CreateString("")));
        frame_header h{};
        h.magic = frame_magic;
        h.version = protocol_version;
        h.kind = static_cast<uint16_t>(frame_kind::hello);
        h.meta_len = b.GetSize();
        h.payload_len = uint64_t{1} << 30;
        std::vector<std::byte> bytes(frame_header_size + b.GetSize() + 4096);
        encode_header(h, bytes.data());
        std::memcpy(bytes.data() + frame_header_size, b.GetBufferPointer(), b.GetSize());
        iovec iov{bytes.data(), bytes.size()};
        REQUIRE(s->write_all({&iov, 1}, after(5s)));
        // The server answers with an error and closes at once (it used to wait 26 s for the gigabyte).
        frame_stream fs(std::move(*s));
        auto in = fs.receive(after(5s), 5s);
        REQUIRE(in);
        CHECK(in->kind() == frame_kind::error);
        std::byte x;
        auto end = fs.raw().read_exact(&x, 1, after(3s));
        REQUIRE(!end);
        CHECK(end.error().code != transport_errc::timeout);
    }
    CHECK(rss_kib(server.pid()) - before < 64L * 1024);
}

TEST_CASE("a call announcing a 1 GiB payload and sending little makes the server hold little",
          "[integration]") {
    server_process server;
    std::vector<std::unique_ptr<raw_client>> held;
    held.reserve(3);
    for (int i = 0; i < 3; ++i) held.push_back(raw_client::open(server.address()));
    for (auto& c : held) REQUIRE(c);
    // A real call frame with a payload, as the client put it on the wire; then the same header announcing a
    // gigabyte, followed by 64 KiB of it and nothing more, on each session's lane.
    std::vector<std::vector<std::byte>> recorded;
    held[0]->record(&recorded);
    held[0]->call(op::mem_get_info, {}, {}, std::vector<std::byte>(16));
    held[0]->record(nullptr);
    REQUIRE(recorded.size() == 1);
    long before = rss_kib(server.pid());
    REQUIRE(before > 0);
    for (auto& c : held) {
        std::vector<std::byte> bytes = recorded[0];
        auto hr = check_header(std::span(bytes).first(frame_header_size), frame_limits{});
        REQUIRE(hr);
        frame_header h = *hr;
        h.payload_len = uint64_t{1} << 30;
        encode_header(h, bytes.data());
        bytes.resize(bytes.size() - 16 + (64 << 10));
        REQUIRE(c->send_raw(bytes));
    }
    std::this_thread::sleep_for(500ms);  // time to read what came
    // Each lane holds one 8 MiB step at most (it held the whole gigabyte, zeroed, before).
    CHECK(rss_kib(server.pid()) - before < 64L * 1024);
}

TEST_CASE(
    "the session and connection limits refuse with a message naming --max-sessions or --max-connections",
    "[integration]") {
    server_process server({"--max-sessions", "2", "--max-connections", "4"});
    std::string why;
    auto a = raw_client::open(server.address());
    auto b = raw_client::open(server.address());
    REQUIRE(a);
    REQUIRE(b);
    CHECK(!raw_client::open(server.address(), 0, {}, &why));
    CHECK(why.find("--max-sessions") != std::string::npos);
    // Two more lanes of a: four connections; the fifth is refused with a message.
    auto a1 = open_retrying(server.address(), a->session_id(), a->key());
    auto a2 = open_retrying(server.address(), a->session_id(), a->key());
    REQUIRE(a1);
    REQUIRE(a2);
    CHECK(!raw_client::open(server.address(), a->session_id(), a->key(), &why));
    CHECK(why.find("--max-connections") != std::string::npos);
    // Room again once a session is gone.
    uint64_t bid = b->session_id();
    b.reset();
    REQUIRE(ended_within(server, bid, 5s));
    a2.reset();
    a1.reset();
    CHECK(open_retrying(server.address()));
}

TEST_CASE("out of descriptors, the accept loop backs off instead of spinning and flooding the log",
          "[integration]") {
    // 40 descriptors: the server's own, and a few connections; the rest wait in the backlog.
    server_process server({}, server_process::transport::tcp, 40);
    REQUIRE(server.wait_for_log("serving"));
    auto ep = endpoint::parse(server.address());
    REQUIRE(ep);
    std::vector<stream> idle;
    for (int i = 0; i < 60; ++i) {
        auto s =
            stream::connect(*ep, 2s);  // completes in the kernel's backlog even when the server cannot accept
        if (s) idle.push_back(std::move(*s));
    }
    REQUIRE(server.wait_for_log("Too many open files", 10));
    std::this_thread::sleep_for(300ms);
    long cpu0 = cpu_ticks(server.pid());
    size_t log0 = server.log().size();
    std::this_thread::sleep_for(2s);
    long cpu = cpu_ticks(server.pid()) - cpu0;
    size_t logged = server.log().size() - log0;
    INFO("CPU ticks in 2 s: " << cpu << ", log bytes: " << logged);
    CHECK(cpu < sysconf(_SC_CLK_TCK) / 2);  // a spinning loop takes about a full core: 2 s
    CHECK(logged < 4096);
    // Descriptors come back when the idle connections go: new clients are served again.
    idle.clear();
    std::unique_ptr<raw_client> c;
    for (int i = 0; i < 100 && !c; ++i) {
        c = raw_client::open(server.address());
        if (!c) std::this_thread::sleep_for(100ms);
    }
    CHECK(c);
}

// ---------------------------------------------------------------- 5. nothing left behind

TEST_CASE("a client that leaves while its host-function thread waits has its session ended",
          "[integration]") {
    server_process server;
    {  // a session that comes and goes first: what stays after it (the driver's own threads) is the baseline
        auto warm = raw_client::open(server.address());
        REQUIRE(warm);
        REQUIRE(warm->call(op::mem_alloc, {1u << 20}).result == CUDA_SUCCESS);
        uint64_t wid = warm->session_id();
        warm.reset();
        REQUIRE(ended_within(server, wid, 5s));
    }
    long threads_before = thread_count(server.pid());
    auto a = raw_client::open(server.address());
    REQUIRE(a);
    uint64_t id = a->session_id();
    REQUIRE(a->call(op::mem_alloc, {64u << 20}).result == CUDA_SUCCESS);
    // The client's host-function thread waits in host_func_next on its own lane, as vcuda's client does.
    auto hf = raw_client::open(server.address(), id, a->key());
    REQUIRE(hf);
    REQUIRE(hf->send_call(op::host_func_next, {}));
    std::this_thread::sleep_for(200ms);
    a.reset();
    hf.reset();  // the process ended
    CHECK(ended_within(server, id, 2s));
    for (int i = 0; i < 100 && thread_count(server.pid()) > threads_before; ++i)
        std::this_thread::sleep_for(20ms);
    CHECK(thread_count(server.pid()) <= threads_before);
}

TEST_CASE("a client that leaves while a call waits for a lane that never connects has its session ended",
          "[integration]") {
    server_process server;
    auto a = raw_client::open(server.address());
    REQUIRE(a);
    uint64_t id = a->session_id();
    REQUIRE(a->call(op::mem_alloc, {64u << 20}).result == CUDA_SUCCESS);
    auto b = raw_client::open(server.address(), id, a->key());
    REQUIRE(b);
    send_ordered_call(*b, op::session_info, 7, 1);  // lane 7 never comes
    std::this_thread::sleep_for(200ms);
    b.reset();
    a.reset();
    CHECK(ended_within(server, id, 2s));
    CHECK(server.log().find("released 64 MiB") != std::string::npos);
}

// ---------------------------------------------------------------- moved sessions
// (server/session_transfer.cpp)

namespace {
// A connection to `address` that has said, as another server would, that it brings a session (HELLO with
// `adopt`).
vcuda::frame_stream adopting_connection(const std::string& address) {
    auto ep = vcuda::endpoint::parse(address);
    REQUIRE(ep);
    auto s = vcuda::stream::connect(*ep, std::chrono::seconds(5));
    REQUIRE(s);
    vcuda::frame_stream fs(std::move(*s));
    flatbuffers::FlatBufferBuilder hb(256);
    hb.Finish(vcuda::wire::CreateHello(hb, vcuda::protocol_version, vcuda::features::all, hb.CreateString(""),
                                       0, 0, 1, hb.CreateString("test"), 0, 0, 0, 0, true));
    REQUIRE(fs.send(vcuda::make_frame(vcuda::frame_kind::hello, hb)));
    return fs;
}

// Offers a session to `address` as another server would (HELLO with `adopt`, then the state, then once it is
// taken the `pieces` it announces); the answer: a Reply's result and detail, or the Error frame's message
// (result -1).
std::pair<int, std::string> offer_moved_session(
    const std::string& address, const std::function<void(flatbuffers::FlatBufferBuilder&)>& state,
    const std::vector<std::vector<std::byte>>& pieces = {}) {
    auto fs = adopting_connection(address);
    flatbuffers::FlatBufferBuilder b(1024);
    state(b);
    if (!fs.send(vcuda::make_frame(vcuda::frame_kind::session_state, b))) return {-2, "send failed"};
    for (bool state_taken = false;;) {
        auto in = fs.receive(vcuda::after(std::chrono::seconds(10)), std::chrono::seconds(10));
        if (!in) return {-2, in.error().message};
        if (in->kind() == vcuda::frame_kind::error) {
            auto* e = vcuda::root_of<vcuda::wire::Error>(*in);
            return {-1, e->message() ? e->message()->str() : ""};
        }
        REQUIRE(in->kind() == vcuda::frame_kind::reply);
        auto* r = vcuda::root_of<vcuda::wire::Reply>(*in);
        // A state with no pieces to send: past the go-ahead (success, no detail) comes the rebuild's answer.
        if (!state_taken && r->result() == CUDA_SUCCESS && !r->detail()) {
            state_taken = true;
            for (size_t i = 0; i < pieces.size(); ++i) {
                flatbuffers::FlatBufferBuilder pb(64);
                pb.Finish(vcuda::wire::CreateStatePiece(pb, i));
                if (!fs.send(vcuda::make_frame(vcuda::frame_kind::state_piece, pb, 0, 0, 0, pieces[i])))
                    return {-2, "piece send failed"};
            }
            continue;
        }
        return {r->result(), r->detail() ? r->detail()->str() : ""};
    }
}

// A moved session's state: session `id` with `key` and 1 MiB pieces; `add` adds the rest (made before, as
// flatbuffers want).
void finish_state(flatbuffers::FlatBufferBuilder& b, uint64_t id, const std::string& key,
                  const std::function<void(vcuda::wire::SessionStateBuilder&)>& add) {
    auto k = b.CreateVector(reinterpret_cast<const uint8_t*>(key.data()), key.size());
    vcuda::wire::SessionStateBuilder sb(b);
    sb.add_session_id(id);
    sb.add_session_key(k);
    sb.add_piece_bytes(1u << 20);
    add(sb);
    b.Finish(sb.Finish());
}
}  // namespace

TEST_CASE(
    "a malformed or colliding moved session is refused and changes nothing else, in either isolation mode",
    "[integration]") {
    // In process mode another worker takes each state, and a colliding id is refused by the parent.
    const bool isolated = GENERATE(false, true);
    INFO((isolated ? "--isolation process" : "--isolation thread"));
    server_process server(isolated ? std::vector<std::string>{"--isolation", "process"}
                                   : std::vector<std::string>{});
    auto a = raw_client::open(server.address());
    REQUIRE(a);
    REQUIRE(a->call(op::mem_alloc, {4096}).result == CUDA_SUCCESS);
    const std::string key(32, 'k');
    auto key_of = [&](flatbuffers::FlatBufferBuilder& b) {
        return b.CreateVector(reinterpret_cast<const uint8_t*>(key.data()), key.size());
    };
    // The id of a live session: refused, the live one untouched.
    auto [rc1, why1] = offer_moved_session(server.address(), [&](flatbuffers::FlatBufferBuilder& b) {
        b.Finish(vcuda::wire::CreateSessionState(b, a->session_id(), key_of(b)));
    });
    CHECK(rc1 == -1);
    CHECK(why1.find("here already") != std::string::npos);
    // A handle of no kind there is.
    auto [rc2, why2] = offer_moved_session(server.address(), [&](flatbuffers::FlatBufferBuilder& b) {
        auto slot = vcuda::wire::CreateMovedSlot(b, 0, 1, true, 200);
        b.Finish(vcuda::wire::CreateSessionState(b, 0x1234, key_of(b), 0, 0, b.CreateVector(&slot, 1)));
    });
    CHECK(rc2 == CUDA_ERROR_INVALID_VALUE);
    CHECK(why2.find("malformed") != std::string::npos);
    // Memory past the GPU's size.
    auto [rc3, why3] = offer_moved_session(server.address(), [&](flatbuffers::FlatBufferBuilder& b) {
        auto m = vcuda::wire::CreateMovedMapping(b, uint64_t{1} << 44, uint64_t{1} << 40);
        auto dev = vcuda::wire::CreateMovedDevice(b, true, 0, 0, b.CreateVector(&m, 1));
        b.Finish(vcuda::wire::CreateSessionState(b, 0x5678, key_of(b), 0, 0, 0, 0, b.CreateVector(&dev, 1), 0,
                                                 0, 0, 0, 0, uint64_t{256} << 20));
    });
    CHECK(rc3 == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(why3.find("quota") != std::string::npos);
    // The program's own VMM state alone: `reservations` (start, size, ...) and `mappings` (start, size,
    // handle id, offset, ...).
    auto vmm_only = [&](uint64_t id, const std::vector<uint64_t>& reservations,
                        const std::vector<uint64_t>& mappings) {
        return offer_moved_session(server.address(), [&](flatbuffers::FlatBufferBuilder& b) {
            auto r = b.CreateVector(reservations);
            auto m = b.CreateVector(mappings);
            auto k = key_of(b);
            vcuda::wire::SessionStateBuilder sb(b);
            sb.add_session_id(id);
            sb.add_session_key(k);
            sb.add_piece_bytes(1u << 20);
            sb.add_vmm_reservations(r);
            sb.add_vmm_mappings(m);
            b.Finish(sb.Finish());
        });
    };
    // A VMM reservation outside the address window every server reserves: not claimable here.
    auto [rc4, why4] = vmm_only(0x4321, {0x1000000, 2u << 20}, {});
    CHECK(rc4 == CUDA_ERROR_ALREADY_MAPPED);
    CHECK(why4.find("not free") != std::string::npos);
    // A VMM mapping of an allocation it does not hold.
    auto [rc5, why5] = vmm_only(0x4322, {}, {0x1000000, 2u << 20, 77, 0});
    CHECK(rc5 == CUDA_ERROR_INVALID_VALUE);
    CHECK(why5.find("malformed") != std::string::npos);
    // Device indices it cannot have here (server/placement.hpp): one past the bound, or more GPUs than this
    // server has (it has one).
    auto with_gpus = [&](uint64_t id, const std::vector<uint32_t>& gpus) {
        return offer_moved_session(server.address(), [&](flatbuffers::FlatBufferBuilder& b) {
            auto g = b.CreateVector(gpus);
            auto k = key_of(b);
            vcuda::wire::SessionStateBuilder sb(b);
            sb.add_session_id(id);
            sb.add_session_key(k);
            sb.add_gpus(g);
            b.Finish(sb.Finish());
        });
    };
    auto [rc6, why6] = with_gpus(0x4323, {1000});
    CHECK(rc6 == -1);
    CHECK(why6.find("device index 1000") != std::string::npos);
    auto [rc7, why7] = with_gpus(0x4324, {0, 1});
    CHECK(rc7 == -1);
    CHECK(why7.find("uses 2 GPU(s); it may have 1 here") != std::string::npos);
    // CUDA arrays (server/array_image.cpp): one handle slot of kind `kind`, and an array record for it.
    auto with_array = [&](uint64_t id, vcuda::handle_kind kind, uint32_t width, size_t content_bytes,
                          uint64_t charge) {
        return offer_moved_session(server.address(), [&](flatbuffers::FlatBufferBuilder& b) {
            auto slot = vcuda::wire::CreateMovedSlot(b, 0, 1, true, static_cast<uint32_t>(kind));
            auto slots = b.CreateVector(&slot, 1);
            CUDA_ARRAY3D_DESCRIPTOR d{};
            d.Width = width;
            d.Height = 4;
            d.Format = CU_AD_FORMAT_FLOAT;
            d.NumChannels = 1;
            auto desc = b.CreateVector(reinterpret_cast<const uint8_t*>(&d), sizeof d);
            std::vector<uint8_t> contents(content_bytes);
            auto bytes = b.CreateVector(contents);
            auto arr =
                vcuda::wire::CreateMovedArray(b, vcuda::make_handle(kind, 1, 0), 0, charge, desc, 0, bytes);
            auto arrays = b.CreateVector(&arr, 1);
            finish_state(b, id, key, [&](vcuda::wire::SessionStateBuilder& sb) {
                sb.add_slots(slots);
                sb.add_arrays(arrays);
            });
        });
    };
    // Contents of another size than its descriptor's; a descriptor past any extent; a handle of another kind;
    // a charge past the quota.
    auto [rc8, why8] = with_array(0x4325, vcuda::handle_kind::array, 16, 16 * 4 * 4 + 1, 0);
    CHECK(rc8 == CUDA_ERROR_INVALID_VALUE);
    CHECK(why8.find("a CUDA array's contents") != std::string::npos);
    auto [rc9, why9] = with_array(0x4326, vcuda::handle_kind::array, 1u << 30, 0, 0);
    CHECK(rc9 == CUDA_ERROR_INVALID_VALUE);
    CHECK(why9.find("a CUDA array's descriptor") != std::string::npos);
    auto [rc10, why10] = with_array(0x4327, vcuda::handle_kind::stream, 16, size_t{16} * 4 * 4, 0);
    CHECK(rc10 == CUDA_ERROR_INVALID_VALUE);
    CHECK(why10.find("a CUDA array") != std::string::npos);
    auto [rc11, why11] =
        with_array(0x4328, vcuda::handle_kind::array, 16, size_t{16} * 4 * 4, uint64_t{1} << 50);
    CHECK(rc11 == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(why11.find("quota") != std::string::npos);
    // Texture objects (server/array_image.cpp): one object record, its resource descriptor `res_bytes` long.
    auto with_object = [&](uint64_t id, size_t res_bytes, CUdeviceptr linear, bool any = true) {
        return offer_moved_session(server.address(), [&](flatbuffers::FlatBufferBuilder& b) {
            CUDA_RESOURCE_DESC r{};
            r.resType = CU_RESOURCE_TYPE_LINEAR;
            r.res.linear.devPtr = linear;
            r.res.linear.format = CU_AD_FORMAT_FLOAT;
            r.res.linear.numChannels = 1;
            r.res.linear.sizeInBytes = 4096;
            CUDA_TEXTURE_DESC t{};
            auto res = b.CreateVector(reinterpret_cast<const uint8_t*>(&r), res_bytes);
            auto made = b.CreateVector(reinterpret_cast<const uint8_t*>(&r), sizeof r);
            auto tex = b.CreateVector(reinterpret_cast<const uint8_t*>(&t), sizeof t);
            auto o = vcuda::wire::CreateMovedObject(b, 0, 1, false, res, made, tex);
            auto objects = b.CreateVector(&o, any ? 1 : 0);
            auto dev = vcuda::wire::CreateMovedDevice(b, true);
            auto devices = b.CreateVector(&dev, 1);
            finish_state(b, id, key, [&](vcuda::wire::SessionStateBuilder& sb) {
                sb.add_devices(devices);
                sb.add_objects(objects);
            });
        });
    };
    // A descriptor of another size; a texture over memory the moved session does not hold (here, the live
    // session's): refused when it is made again, before the answer.
    auto [rc12, why12] = with_object(0x4329, sizeof(CUDA_RESOURCE_DESC) - 8, 0);
    CHECK(rc12 == CUDA_ERROR_INVALID_VALUE);
    CHECK(why12.find("a texture or surface object") != std::string::npos);
    auto live = a->call(op::mem_alloc, {4096});
    REQUIRE(live.result == CUDA_SUCCESS);
    auto [rc13, why13] = with_object(0x432a, sizeof(CUDA_RESOURCE_DESC), live.outs.at(0));
    CHECK(rc13 == CUDA_ERROR_INVALID_VALUE);
    CHECK(why13.find("reads what the session does not hold") != std::string::npos);
    // A session refused after its id was taken here (its rebuild failed) gives the id up before the answer:
    // offered again at once without the object, it is taken (and ends when this offer's connection closes).
    auto [rc14, why14] = with_object(0x432b, sizeof(CUDA_RESOURCE_DESC), live.outs.at(0));
    CHECK(rc14 == CUDA_ERROR_INVALID_VALUE);
    auto [rc15, why15] = with_object(0x432b, sizeof(CUDA_RESOURCE_DESC), 0, false);
    CHECK(rc15 == CUDA_SUCCESS);
    CHECK(why15.empty());
    if (isolated) CHECK(server.wait_for_log("session 17195 was not taken by worker pid"));
    // Stream attributes (settable_stream_attributes): one a stream cannot be given (cooperative), and a value
    // of another size than CUstreamAttrValue.
    auto with_stream_attribute = [&](uint64_t id, uint32_t attr, size_t value_bytes) {
        return offer_moved_session(server.address(), [&](flatbuffers::FlatBufferBuilder& b) {
            std::vector<uint8_t> value(value_bytes);
            auto at = vcuda::wire::CreateMovedStreamAttribute(b, attr, b.CreateVector(value));
            auto attrs = b.CreateVector(&at, 1);
            auto e = vcuda::wire::CreateMovedEntry(b, 1, 0, 0, 0, 0, false, 0, attrs);
            auto entries = b.CreateVector(&e, 1);
            finish_state(b, id, key, [&](vcuda::wire::SessionStateBuilder& sb) { sb.add_entries(entries); });
        });
    };
    auto [rc16, why16] =
        with_stream_attribute(0x432c, CU_LAUNCH_ATTRIBUTE_COOPERATIVE, sizeof(CUstreamAttrValue));
    CHECK(rc16 == CUDA_ERROR_INVALID_VALUE);
    CHECK(why16.find("a stream attribute") != std::string::npos);
    auto [rc17, why17] = with_stream_attribute(0x432d, CU_LAUNCH_ATTRIBUTE_SYNCHRONIZATION_POLICY, 4);
    CHECK(rc17 == CUDA_ERROR_INVALID_VALUE);
    CHECK(why17.find("a stream attribute") != std::string::npos);
    // An offer abandoned right after HELLO.
    { auto fs = adopting_connection(server.address()); }
    // Nothing of them stays, and the live session goes on.
    for (uint64_t id : {0x1234, 0x5678, 0x4321, 0x4322, 0x4323, 0x4324, 0x4325, 0x4326, 0x4327, 0x4328,
                        0x4329, 0x432a, 0x432c, 0x432d})
        CHECK(!raw_client::open(server.address(), id, key));
    CHECK(a->call(op::mem_alloc, {4096}).result == CUDA_SUCCESS);
    if (isolated) {  // each offer had a worker of its own: only the live session's is left
        auto children = [pid = server.pid()] {  // (unreaped ones too: the wait below covers the reaping)
            int n = 0;
            for (const auto& e : std::filesystem::directory_iterator("/proc"))
                if (int p = std::atoi(e.path().filename().c_str()); p > 0)
                    n += proc_number(p, "status", "PPid:") == pid;
            return n;
        };
        int left = 0;
        for (int i = 0; i < 100 && (left = children()) != 1; ++i)
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
        CHECK(left == 1);
    }
}

TEST_CASE("a moved session's CUDA graphs are checked before anything is made of them", "[integration]") {
    server_process server;
    auto a = raw_client::open(server.address());
    REQUIRE(a);
    auto live = a->call(op::mem_alloc, {4096});  // another tenant's memory
    REQUIRE(live.result == CUDA_SUCCESS);
    const std::string key(32, 'k');
    using vcuda::handle_kind;
    const uint64_t graph = vcuda::make_handle(handle_kind::graph, 1, 0);
    const uint64_t node = vcuda::make_handle(handle_kind::graph_node, 1, 1);
    const uint64_t function = vcuda::make_handle(handle_kind::function, 1, 2);
    // One graph (handle `graph`) of the nodes `add` makes, with `edges` (from, to, ...), and a function whose
    // parameters are 8 + 4 bytes.
    using node_maker = std::function<std::vector<flatbuffers::Offset<vcuda::wire::MovedGraphNode>>(
        flatbuffers::FlatBufferBuilder&)>;
    auto with_graph = [&](uint64_t id, const node_maker& add, const std::vector<uint64_t>& edges) {
        return offer_moved_session(server.address(), [&](flatbuffers::FlatBufferBuilder& b) {
            std::vector<uint32_t> layout = {0, 8, 8, 4};
            std::vector<flatbuffers::Offset<vcuda::wire::MovedSlot>> slot_list = {
                vcuda::wire::CreateMovedSlot(b, 0, 1, true, static_cast<uint32_t>(handle_kind::graph)),
                vcuda::wire::CreateMovedSlot(b, 1, 1, true, static_cast<uint32_t>(handle_kind::graph_node), 0,
                                             graph, true),
                vcuda::wire::CreateMovedSlot(b, 2, 1, true, static_cast<uint32_t>(handle_kind::function), 0,
                                             0, false, 0, 0, b.CreateVector(layout))};
            auto slots = b.CreateVector(slot_list);
            auto nodes = b.CreateVector(add(b));
            std::vector<CUgraphEdgeData> data(edges.size() / 2);
            auto g =
                vcuda::wire::CreateMovedGraph(b, graph, 0, 0, 0, nodes, b.CreateVector(edges),
                                              b.CreateVector(reinterpret_cast<const uint8_t*>(data.data()),
                                                             data.size() * sizeof(CUgraphEdgeData)));
            auto graphs = b.CreateVector(&g, 1);
            auto dev = vcuda::wire::CreateMovedDevice(b, true);
            auto devices = b.CreateVector(&dev, 1);
            finish_state(b, id, key, [&](vcuda::wire::SessionStateBuilder& sb) {
                sb.add_slots(slots);
                sb.add_devices(devices);
                sb.add_graphs(graphs);
            });
        });
    };
    auto kernel = [&](size_t param_bytes, const std::vector<CUlaunchAttribute>& attributes = {}) {
        return [=](flatbuffers::FlatBufferBuilder& b) {
            std::vector<uint32_t> dims = {1, 1, 1, 32, 1, 1, 0};
            std::vector<uint8_t> params(param_bytes);
            std::vector<uint64_t> ids = {node};
            auto attrs = b.CreateVector(reinterpret_cast<const uint8_t*>(attributes.data()),
                                        attributes.size() * sizeof(CUlaunchAttribute));
            return std::vector{vcuda::wire::CreateMovedGraphNode(
                b, CU_GRAPH_NODE_TYPE_KERNEL, b.CreateVector(ids), function, b.CreateVector(dims),
                b.CreateVector(params), 0, 0, 0, 0, 0, 0, attrs)};
        };
    };
    // A device-to-host copy of 64 bytes from `device` to `host`.
    auto copy = [&](CUdeviceptr device, uintptr_t host) {
        return [=](flatbuffers::FlatBufferBuilder& b) {
            CUDA_MEMCPY3D c{};
            c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
            c.srcDevice = device;
            c.dstMemoryType = CU_MEMORYTYPE_HOST;
            c.dstHost = reinterpret_cast<void*>(host);
            c.WidthInBytes = 64;
            c.Height = c.Depth = 1;
            return std::vector{vcuda::wire::CreateMovedGraphNode(b, CU_GRAPH_NODE_TYPE_MEMCPY, 0, 0, 0, 0, 0,
                                                                 vcuda::struct_vector(b, c))};
        };
    };
    // Parameters shorter than the function's: the driver would read past them.
    auto [rc1, why1] = with_graph(0x5001, kernel(10), {});
    CHECK(rc1 == CUDA_ERROR_INVALID_VALUE);
    CHECK(why1.find("a graph's kernel node") != std::string::npos);
    // A copy into host memory that is not the session's (the server's own), or out of another tenant's
    // memory.
    auto [rc2, why2] = with_graph(0x5002, copy(0x10000, reinterpret_cast<uintptr_t>(&key)), {});
    CHECK(rc2 == CUDA_ERROR_INVALID_VALUE);
    CHECK(why2.find("a graph's memcpy node") != std::string::npos);
    auto [rc3, why3] = with_graph(0x5003, copy(live.outs.at(0), 0), {});
    CHECK(rc3 == CUDA_ERROR_INVALID_VALUE);
    CHECK(why3.find("a graph's memcpy node") != std::string::npos);
    // An edge to a node the graph does not have.
    auto [rc4, why4] = with_graph(0x5004, kernel(12), {0, 1});
    CHECK(rc4 == CUDA_ERROR_INVALID_VALUE);
    CHECK(why4.find("a graph's edges") != std::string::npos);
    // A child graph node naming a graph that is not an earlier one.
    auto [rc5, why5] = with_graph(0x5005,
                                  [&](flatbuffers::FlatBufferBuilder& b) {
                                      return std::vector{vcuda::wire::CreateMovedGraphNode(
                                          b, CU_GRAPH_NODE_TYPE_GRAPH, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)};
                                  },
                                  {});
    CHECK(rc5 == CUDA_ERROR_INVALID_VALUE);
    CHECK(why5.find("a graph's child graph node") != std::string::npos);
    // Kernel node attributes: one a suspend does not carry (a device-updatable node's device handle), and an
    // access policy window over another tenant's memory.
    CUlaunchAttribute updatable{};
    updatable.id = CU_LAUNCH_ATTRIBUTE_DEVICE_UPDATABLE_KERNEL_NODE;
    updatable.value.deviceUpdatableKernelNode.deviceUpdatable = 1;
    auto [rc6, why6] = with_graph(0x5006, kernel(12, {updatable}), {});
    CHECK(rc6 == CUDA_ERROR_INVALID_VALUE);
    CHECK(why6.find("a graph's kernel node") != std::string::npos);
    CUlaunchAttribute window{};
    window.id = CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW;
    window.value.accessPolicyWindow.base_ptr = reinterpret_cast<void*>(live.outs.at(0));
    window.value.accessPolicyWindow.num_bytes = 4096;
    auto [rc7, why7] = with_graph(0x5007, kernel(12, {window}), {});
    CHECK(rc7 == CUDA_ERROR_INVALID_VALUE);
    CHECK(why7.find("a graph's kernel node") != std::string::npos);
    for (uint64_t id : {0x5001, 0x5002, 0x5003, 0x5004, 0x5005, 0x5006, 0x5007})
        CHECK(!raw_client::open(server.address(), id, key));
    CHECK(a->call(op::mem_alloc, {4096}).result == CUDA_SUCCESS);
}

TEST_CASE("a moved session's kernel whose parameter layout is not the driver's is refused", "[integration]") {
    // Launches are packed at the layout the session's table holds; one shorter than the kernel's would hand
    // the driver a parameter array it reads past (the crash of the conformance issue, every tenant lost).
    server_process server;
    auto a = raw_client::open(server.address());
    REQUIRE(a);
    const std::string key(32, 'k');
    using vcuda::handle_kind;
    const uint64_t library = vcuda::make_handle(handle_kind::library, 1, 0);
    const uint64_t kernel = vcuda::make_handle(handle_kind::kernel, 1, 1);
    // A library (the software driver does not parse images: 16 bytes do) and its kernel drv_scale(float*,
    // float, int), said to have `layout` (offset, size, ...).
    auto with_kernel = [&](uint64_t id, const std::vector<uint32_t>& layout) {
        const std::vector<std::byte> image(16, std::byte{0x5a});
        return offer_moved_session(
            server.address(),
            [&](flatbuffers::FlatBufferBuilder& b) {
                std::vector<flatbuffers::Offset<vcuda::wire::MovedSlot>> slot_list = {
                    vcuda::wire::CreateMovedSlot(b, 0, 1, true, static_cast<uint32_t>(handle_kind::library)),
                    vcuda::wire::CreateMovedSlot(b, 1, 1, true, static_cast<uint32_t>(handle_kind::kernel), 0,
                                                 library, true, 0, 0, b.CreateVector(layout))};
                auto slots = b.CreateVector(slot_list);
                std::vector<uint64_t> words = {image.size() / 8};
                auto origin = vcuda::wire::CreateMovedOrigin(b, library, true, 1, 0, b.CreateVector(words));
                auto origins = b.CreateVector(&origin, 1);
                std::vector<flatbuffers::Offset<vcuda::wire::MovedEntry>> entry_list = {
                    vcuda::wire::CreateMovedEntry(b, library),
                    vcuda::wire::CreateMovedEntry(b, kernel, b.CreateString("drv_scale"))};
                auto entries = b.CreateVector(entry_list);
                auto dev = vcuda::wire::CreateMovedDevice(b, true);
                auto devices = b.CreateVector(&dev, 1);
                finish_state(b, id, key, [&](vcuda::wire::SessionStateBuilder& sb) {
                    sb.add_slots(slots);
                    sb.add_origins(origins);
                    sb.add_entries(entries);
                    sb.add_devices(devices);
                });
            },
            {image});
    };
    auto [rc1, why1] = with_kernel(0x6001, {0, 8});
    CHECK(rc1 == CUDA_ERROR_INVALID_VALUE);
    CHECK(why1.find("kernel drv_scale came with another parameter layout than the driver's") !=
          std::string::npos);
    CHECK(!raw_client::open(server.address(), 0x6001, key));
    // The kernel's own layout: taken.
    auto [rc2, why2] = with_kernel(0x6002, {0, 8, 8, 4, 12, 4});
    CHECK(rc2 == CUDA_SUCCESS);
    CHECK(why2.empty());
    CHECK(a->call(op::mem_alloc, {4096}).result == CUDA_SUCCESS);
}

TEST_CASE("pre-copied pieces that do not fit are refused before any state and change nothing else",
          "[integration]") {
    server_process server;
    auto a = raw_client::open(server.address());
    REQUIRE(a);
    REQUIRE(a->call(op::mem_alloc, {4096}).result == CUDA_SUCCESS);
    // Sends one pre-copy piece (HELLO with `adopt` first), returns the server's Error message.
    auto offer_piece = [&](bool precopy, uint64_t va, uint64_t mapping_size, uint64_t offset, size_t bytes) {
        auto fs = adopting_connection(server.address());
        flatbuffers::FlatBufferBuilder pb(96);
        pb.Finish(vcuda::wire::CreateStatePiece(pb, 0, precopy, va, mapping_size, offset));
        std::vector<std::byte> payload(bytes, std::byte{7});
        (void)fs.send(vcuda::make_frame(vcuda::frame_kind::state_piece, pb, 0, 0, 0, payload));
        auto in = fs.receive(vcuda::after(std::chrono::seconds(10)), std::chrono::seconds(10));
        REQUIRE(in);
        REQUIRE(in->kind() == vcuda::frame_kind::error);
        auto* e = vcuda::root_of<vcuda::wire::Error>(*in);
        return e->message() ? e->message()->str() : std::string();
    };
    // A mapping larger than everything the session may hold here: nothing is taken for it.
    CHECK(offer_piece(true, uint64_t{1} << 44, uint64_t{1} << 50, 0, 4096).find("exceeds") !=
          std::string::npos);
    // A piece past the end of its mapping.
    CHECK(offer_piece(true, uint64_t{1} << 44, 1u << 20, 1u << 20, 4096).find("outside its mapping") !=
          std::string::npos);
    // A memory piece that is not a pre-copied one, before the state.
    CHECK(offer_piece(false, 0, 0, 0, 4096).find("before the session's state") != std::string::npos);
    CHECK(a->call(op::mem_alloc, {4096}).result == CUDA_SUCCESS);
}
