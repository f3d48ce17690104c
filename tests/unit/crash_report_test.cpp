// The crash report (common/crash_report.hpp): a process that installed it and then faults writes the signal
// and a backtrace to stderr, and still dies of that signal.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <string>

#include "common/crash_report.hpp"

// Under AddressSanitizer + UBSan (tools/test.sh's second stage) the sanitizers see the faults first (UBSan's
// null check ends the child before any signal): the report is tested in the plain build only.
#if !defined(__SANITIZE_ADDRESS__)

namespace {

// Runs `fault` in a child whose stderr goes to a pipe; returns what it wrote and how it ended.
std::string crash_child(void (*fault)(), int& status) {
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::dup2(fds[1], STDERR_FILENO);
        ::close(fds[0]);
        vcuda::install_crash_report("crash-test");
        fault();
        ::_exit(0);  // not reached when the fault kills
    }
    ::close(fds[1]);
    std::string out;
    char buf[4096];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
    ::close(fds[0]);
    ::waitpid(pid, &status, 0);
    return out;
}

void null_write() {
    volatile int* p = nullptr;
    *p = 1;  // NOLINT(clang-analyzer-core.NullDereference): the fault under test
}

void abort_now() { std::abort(); }

}  // namespace

TEST_CASE("a fatal signal is reported with a backtrace and still ends the process") {
    int status = 0;
    std::string out = crash_child(null_write, status);
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGSEGV);
    CHECK(out.find("crash-test: fatal signal SEGV at address 0x0000000000000000; backtrace:") !=
          std::string::npos);
    CHECK(out.find("vcuda_unit_tests(") != std::string::npos);  // a frame of this program

    out = crash_child(abort_now, status);
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGABRT);
    CHECK(out.find("crash-test: fatal signal ABRT") != std::string::npos);
}

#endif  // !__SANITIZE_ADDRESS__
