#include "common/crash_report.hpp"

#include <execinfo.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <csignal>
#include <cstdint>
#include <cstring>

namespace vcuda {
namespace {

const char* program_name = "vcuda";
std::atomic<bool> installed{false};

// Async-signal-safe output only: write(2) of fixed buffers, no allocation, no stdio.
void put(const char* s) {
    if (::write(STDERR_FILENO, s, std::strlen(s)) < 0) return;
}

void put_hex(uintptr_t v) {
    std::array<char, 2 + 16 + 1> text{};
    text[0] = '0';
    text[1] = 'x';
    for (int i = 0; i < 16; ++i) text[2 + i] = "0123456789abcdef"[(v >> (60 - 4 * i)) & 0xf];
    put(text.data());
}

void on_fatal(int sig, siginfo_t* info, void*) {
    put("\n");
    put(program_name);
    put(": fatal signal ");
    put(sigabbrev_np(sig) ? sigabbrev_np(sig) : "?");
    put(" at address ");
    put_hex(reinterpret_cast<uintptr_t>(info ? info->si_addr : nullptr));
    put("; backtrace:\n");
    std::array<void*, 64> frames{};
    int n = ::backtrace(frames.data(), static_cast<int>(frames.size()));
    ::backtrace_symbols_fd(frames.data(), n, STDERR_FILENO);
    // The default action now: the process ends as the signal would have ended it.
    std::signal(sig, SIG_DFL);
    ::raise(sig);
}

}  // namespace

void install_crash_report(const char* program) {
    if (installed.exchange(true)) return;
    program_name = program;
    // backtrace() loads its unwinder on first use, which may allocate: done here, not in the handler.
    std::array<void*, 2> warm{};
    ::backtrace(warm.data(), static_cast<int>(warm.size()));
    struct sigaction sa {};
    sa.sa_sigaction = on_fatal;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) ::sigaction(sig, &sa, nullptr);
}

}  // namespace vcuda
