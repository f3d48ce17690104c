// Issue 17, point 10: fault injection. The Nth read or write of a transport fails (common/transport.hpp,
// fault_injection), for every N over the first operations of a short session, on the client's side (the raw
// client in this process, and vcuda's libcuda in a program) and on the server's. Each time the client gets an
// error or a lost connection, never a hang or a crash; the server ends the session within 2 s; the next
// session works.
#include <catch2/catch.hpp>

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "raw_client.hpp"

using namespace vcuda;
using namespace vcuda::test;
using namespace std::chrono_literals;

namespace {

bool ended_within(const server_process& s, uint64_t session, std::chrono::milliseconds limit) {
    auto until = std::chrono::steady_clock::now() + limit;
    std::string line = "session " + std::to_string(session) + " ended";
    while (std::chrono::steady_clock::now() < until) {
        if (s.log().find(line) != std::string::npos) return true;
        std::this_thread::sleep_for(20ms);
    }
    return s.log().find(line) != std::string::npos;
}

// A short session: open, alloc, copy in, memset, copy out, compare, free. Stops at the first failure, which
// must be a clean one: an error result, or a connection reported lost. Returns the session's id (0 when HELLO
// failed) and whether everything succeeded.
struct session_outcome {
    uint64_t id = 0;
    bool completed = false;
    bool wrong_bytes = false;
    std::string stopped;  // where it stopped, and why (for the test's messages)
};

session_outcome short_session(const std::string& address) {
    session_outcome out;
    auto c = raw_client::open(address, 0, {}, &out.stopped);
    if (!c) {
        out.stopped = "HELLO: " + out.stopped;
        return out;
    }
    out.id = c->session_id();
    auto failed = [&](const char* what, const raw_reply& r) {
        out.stopped = std::string(what) + ": result " + std::to_string(r.result) + " " + r.detail;
        return r.result != CUDA_SUCCESS;
    };
    auto a = c->call(op::mem_alloc, {8192});
    if (failed("mem_alloc", a) || a.outs.size() != 1) return out;
    std::vector<std::byte> data(8192);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 7);
    if (failed("copy_htod", c->call(op::copy_htod, {a.outs[0], 0}, {}, data))) return out;
    if (failed("memset", c->call(op::memset, {a.outs[0], 0x11, 1, 256, 1, 256, 0}))) return out;
    std::fill(data.begin(), data.begin() + 256, std::byte{0x11});
    auto back = c->call(op::copy_dtoh, {a.outs[0], data.size(), 0});
    if (failed("copy_dtoh", back)) return out;
    out.wrong_bytes = back.payload != data;
    if (failed("mem_free", c->call(op::mem_free, {a.outs[0]}))) return out;
    if (failed("mem_get_info", c->call(op::mem_get_info, {}))) return out;
    out.stopped.clear();
    out.completed = true;
    return out;
}

// What the sweeps check after each fault: the faulted session (if it had started) ends within 2 s, and a new
// one completes.
void check_after_fault(const server_process& server, const session_outcome& o, const char* what, uint64_t n) {
    INFO(what << " fault at operation " << n);
    CHECK(!o.wrong_bytes);
    if (o.id && !o.completed) CHECK(ended_within(server, o.id, 2s));
    auto next = short_session(server.address());
    INFO("the next session stopped at " << next.stopped);
    if (!next.completed) {  // what the server said, for whoever reads the failure
        const std::string log = server.log();
        INFO("the server's log ends with: " << log.substr(log.size() > 3000 ? log.size() - 3000 : 0));
        CHECK(next.completed);
    }
    CHECK(!next.wrong_bytes);
}

constexpr uint64_t sweep = 50;

}  // namespace

TEST_CASE("a failed read or write at any point of the client's session is a clean error and harms nothing",
          "[integration]") {
    if (!fault_injection::available()) {
        WARN("built without VCUDA_FAULT_INJECTION: nothing to test");
        return;
    }
    server_process server;
    for (uint64_t n = 1; n <= sweep; ++n) {
        for (bool reading : {true, false}) {
            reading ? fault_injection::fail_read(n) : fault_injection::fail_write(n);
            auto start = std::chrono::steady_clock::now();
            auto o = short_session(server.address());
            fault_injection::fail_read(0);
            fault_injection::fail_write(0);
            CHECK(std::chrono::steady_clock::now() - start < 10s);  // no hang
            check_after_fault(server, o, reading ? "client read" : "client write", n);
        }
    }
}

TEST_CASE("a failed read or write at any point of the server's side of a session ends that session only",
          "[integration]") {
    if (!fault_injection::available()) {
        WARN("built without VCUDA_FAULT_INJECTION: nothing to test");
        return;
    }
    // The server counts its reads and writes from its start, across its connections (N = 1: HELLO's header):
    // one server per point.
    for (uint64_t n = 1; n <= sweep; ++n) {
        for (bool reading : {true, false}) {
            const char* var = reading ? "VCUDA_FAULT_READ_N" : "VCUDA_FAULT_WRITE_N";
            setenv(var, std::to_string(n).c_str(), 1);
            server_process server;
            unsetenv(var);
            // The fault falls in the first session, or (N past its operations) in a later one: sessions until
            // one meets it.
            session_outcome o;
            for (uint64_t i = 0; i < sweep; ++i) {  // each session has at least one operation
                auto start = std::chrono::steady_clock::now();
                o = short_session(server.address());
                CHECK(std::chrono::steady_clock::now() - start < 10s);
                // A fault on the read that meets a finished session's end harms nothing: that session
                // completed.
                if (!o.completed || server.log().find("injected fault") != std::string::npos) break;
            }
            INFO((reading ? "server read" : "server write") << " fault at operation " << n);
            check_after_fault(server, o, reading ? "server read" : "server write", n);
            int status = 0;
            CHECK(waitpid(server.pid(), &status, WNOHANG) == 0);  // still running
        }
    }
}

TEST_CASE("vcuda's libcuda reports a failed read or write at any point as an error, never a hang or crash",
          "[integration]") {
    if (!fault_injection::available()) {
        WARN("built without VCUDA_FAULT_INJECTION: nothing to test");
        return;
    }
    server_process server;
    for (uint64_t n = 1; n <= sweep; ++n) {
        for (bool reading : {true, false}) {
            char tmpl[] = "/tmp/vcuda-fault-XXXXXX";
            int fd = mkstemp(tmpl);
            REQUIRE(fd >= 0);
            pid_t pid = fork();
            if (pid == 0) {
                dup2(fd, 1);
                dup2(fd, 2);
                setenv("VCUDA_SERVER", server.address().c_str(), 1);
                setenv(reading ? "VCUDA_FAULT_READ_N" : "VCUDA_FAULT_WRITE_N", std::to_string(n).c_str(), 1);
                execl(VCUDA_BULK_CLIENT, VCUDA_BULK_CLIENT, "verify", "65536", nullptr);
                _exit(127);
            }
            close(fd);
            int status = 0;
            bool exited = false;
            for (int i = 0; i < 2000 && !exited; ++i) {  // 20 s: a hang, not a slow machine
                exited = waitpid(pid, &status, WNOHANG) == pid;
                if (!exited) std::this_thread::sleep_for(10ms);
            }
            if (!exited) {
                kill(pid, SIGKILL);
                waitpid(pid, &status, 0);
            }
            std::ifstream in(tmpl);
            std::stringstream text;
            text << in.rdbuf();
            unlink(tmpl);
            INFO((reading ? "client read" : "client write") << " fault at operation " << n << ":\n"
                                                            << text.str());
            CHECK(exited);
            CHECK(WIFEXITED(status));  // not killed by a signal (a crash)
            bool passed = text.str().find("PASS verify") != std::string::npos;
            bool clean_error = text.str().find("FAIL ") != std::string::npos &&
                               text.str().find("CUDA_ERROR_") != std::string::npos;
            CHECK((passed || clean_error));
        }
    }
    CHECK(short_session(server.address()).completed);
}
