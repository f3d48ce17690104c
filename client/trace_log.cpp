#include "client/trace_log.hpp"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "client/error_names.hpp"

namespace vcuda::client::trace {

namespace {

std::atomic<int> out_fd{-1};
uint64_t start_ns = 0;
int cached_pid = 0;

uint64_t monotonic_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

thread_local int tls_tid = 0;
thread_local int tls_depth = 0;

int thread_id() {
    if (tls_tid == 0) tls_tid = static_cast<int>(syscall(SYS_gettid));
    return tls_tid;
}

void after_fork_child() {
    cached_pid = static_cast<int>(getpid());
    tls_tid = 0;
}

void write_all(const char* p, size_t n) {
    int fd = out_fd.load(std::memory_order_relaxed);
    if (fd < 0) return;
    while (n > 0) {
        ssize_t w = ::write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return;
        }
        p += w;
        n -= static_cast<size_t>(w);
    }
}

void start_clock() {
    if (start_ns == 0) start_ns = monotonic_ns();
    cached_pid = static_cast<int>(getpid());
    static std::once_flag atfork;
    std::call_once(atfork, [] { pthread_atfork(nullptr, nullptr, &after_fork_child); });
}

void write_opening() {
    char exe[512] = {0};
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n < 0) exe[0] = '\0';
    timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    char head[768];
    std::snprintf(head, sizeof head, "# vcuda trace: pid=%d exe=%s unix_time=%lld.%06ld", cached_pid, exe,
                  static_cast<long long>(rt.tv_sec), rt.tv_nsec / 1000);
    write_raw(head);
}

}  // namespace

bool enter_lines = false;

bool open_output(const char* spec) {
    start_clock();
    if (!spec || !*spec) return false;
    if (std::strcmp(spec, "1") == 0 || std::strcmp(spec, "stderr") == 0) {
        out_fd.store(2);
    } else {
        std::string path;
        for (const char* s = spec; *s; ++s) {
            if (s[0] == '%' && s[1] == 'p') {
                path += std::to_string(cached_pid);
                ++s;
            } else {
                path += *s;
            }
        }
        int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd < 0) {
            std::fprintf(stderr, "vcuda: VCUDA_TRACE: cannot open %s: %s\n", path.c_str(),
                         std::strerror(errno));
            return false;
        }
        out_fd.store(fd);
    }
    write_opening();
    return true;
}

void set_output_fd(int fd) {
    start_clock();
    out_fd.store(fd);
}

void write_raw(const char* text) {
    line l;
    l.put(text);
    l.emit();
}

uint64_t now_ns() { return monotonic_ns(); }

int& depth() { return tls_depth; }

const char* result_name(int rc) {
    auto* e = find_error_name(rc);
    return e ? e->name : nullptr;
}

// ---------------------------------------------------------------- safe reads

namespace {

std::mutex pipe_mu;
int probe_pipe[2] = {-1, -1};

bool read_through_pipe(const void* addr, void* out, size_t n) {
    std::lock_guard lock(pipe_mu);
    if (probe_pipe[0] < 0 && pipe2(probe_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return false;
    // write(2) reports EFAULT for memory it cannot read, instead of faulting.
    ssize_t w = ::write(probe_pipe[1], addr, n);
    if (w <= 0) return false;
    char sink[64];
    ssize_t r = ::read(probe_pipe[0], w == static_cast<ssize_t>(n) ? out : sink,
                       static_cast<size_t>(w) <= sizeof sink ? static_cast<size_t>(w) : sizeof sink);
    return w == static_cast<ssize_t>(n) && r == w;
}

}  // namespace

bool safe_read(const void* addr, void* out, size_t n) {
    if (n == 0) return true;
    if (n > 512) return false;  // 64 words: VCUDA_TRACE_WORDS at most
    static std::atomic<bool> use_pipe{false};
    if (!use_pipe.load(std::memory_order_relaxed)) {
        iovec local{out, n};
        iovec remote{const_cast<void*>(addr), n};
        ssize_t r = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
        if (r == static_cast<ssize_t>(n)) return true;
        if (r >= 0 || errno == EFAULT || errno == ESRCH) return false;
        use_pipe.store(true);  // EPERM / ENOSYS: a seccomp profile refuses it
    }
    return read_through_pipe(addr, out, n);
}

// ---------------------------------------------------------------- lines

void line::put(const char* s) { put(s, std::strlen(s)); }

void line::put(const char* s, size_t n) {
    size_t room = capacity - 8 - n_;  // keeps room for "...\n"
    if (n > room) {
        n = room;
        cut_ = true;
    }
    std::memcpy(buf_ + n_, s, n);
    n_ += n;
}

void line::put_char(char c) { put(&c, 1); }

void line::dec(long long v) {
    char b[24];
    int k = std::snprintf(b, sizeof b, "%lld", v);
    put(b, static_cast<size_t>(k));
}

void line::udec(unsigned long long v) {
    char b[24];
    int k = std::snprintf(b, sizeof b, "%llu", v);
    put(b, static_cast<size_t>(k));
}

void line::hex(unsigned long long v) {
    char b[24];
    int k = std::snprintf(b, sizeof b, "0x%llx", v);
    put(b, static_cast<size_t>(k));
}

void line::flt(double v) {
    char b[40];
    int k = std::snprintf(b, sizeof b, "%g", v);
    put(b, static_cast<size_t>(k));
}

void line::quoted(const char* s, size_t max_chars) {
    if (!s) {
        put("null", 4);
        return;
    }
    put_char('"');
    size_t i = 0;
    for (; s[i] && i < max_chars; ++i) {
        unsigned char c = static_cast<unsigned char>(s[i]);
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', static_cast<char>(c)};
            put(e, 2);
        } else if (c < 0x20 || c >= 0x7f) {
            char e[8];
            int k = std::snprintf(e, sizeof e, "\\x%02x", c);
            put(e, static_cast<size_t>(k));
        } else {
            put_char(static_cast<char>(c));
        }
    }
    put_char('"');
    if (s[i]) put("...", 3);
}

void line::bytes(const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    put_char('{');
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        std::memcpy(&w, b + i, 8);
        if (i) put(", ", 2);
        hex(w);
    }
    for (; i < n; ++i) {
        if (i) put(", ", 2);
        hex(b[i]);
    }
    put_char('}');
}

void line::uuid(const unsigned char* b) {
    char s[40];
    int k = 0;
    for (int i = 0; i < 16; ++i) {
        if (i == 4 || i == 6 || i == 8 || i == 10) s[k++] = '-';
        k += std::snprintf(s + k, sizeof s - static_cast<size_t>(k), "%02x", b[i]);
    }
    put(s, static_cast<size_t>(k));
}

void line::prefix(uint64_t t, int d) {
    char b[96];
    uint64_t rel = t > start_ns ? t - start_ns : 0;
    int k = std::snprintf(
        b, sizeof b, "%llu.%06llu pid=%d tid=%d ", static_cast<unsigned long long>(rel / 1000000000ull),
        static_cast<unsigned long long>(rel % 1000000000ull / 1000), cached_pid, thread_id());
    put(b, static_cast<size_t>(k));
    if (d > 0) {
        put("depth=", 6);
        dec(d);
        put_char(' ');
    }
}

void line::emit() {
    if (cut_) {
        std::memcpy(buf_ + n_, "...", 3);
        n_ += 3;
    }
    buf_[n_++] = '\n';
    write_all(buf_, n_);
    n_ = 0;
    cut_ = false;
}

// ---------------------------------------------------------------- calls

call::call(const char* name) : name_(name), start_(monotonic_ns()), depth_(tls_depth++) {
    if (enter_lines) {
        line e;
        e.prefix(start_, depth_);
        e.put("> ", 2);
        e.put(name_);
        e.emit();
    }
}

void call::done() {
    end_ = monotonic_ns();
    errno_ = errno;
    --tls_depth;
    l_.prefix(start_, depth_);
    l_.put(name_);
    l_.put_char('(');
}

void call::emit() {
    l_.emit();
    errno = errno_;
}

void call::key(const char* n) {
    if (end_ == 0) done();  // formatting without done(): the call never ran (no real driver)
    if (!first_) l_.put(", ", 2);
    first_ = false;
    l_.put(n);
    l_.put_char('=');
}

void call::result_arg(const char* n, int rc) {
    key(n);
    if (const char* s = result_name(rc))
        l_.put(s);
    else
        l_.dec(rc);
}

void call::uuid(const char* n, const void* p) {
    key(n);
    l_.hex(reinterpret_cast<uintptr_t>(p));
    if (p) {
        l_.put("->", 2);
        l_.uuid(static_cast<const unsigned char*>(p));
    }
}

void call::out_uuid(const char* n, const void* p, bool ok) {
    key(n);
    l_.hex(reinterpret_cast<uintptr_t>(p));
    if (ok && p) {
        l_.put("->", 2);
        l_.uuid(static_cast<const unsigned char*>(p));
    }
}

void call::strbuf(const char* n, const char* s, long long len, bool ok) {
    key(n);
    l_.hex(reinterpret_cast<uintptr_t>(s));
    if (ok && s && len > 0) {
        size_t max = 0;
        while (max < static_cast<size_t>(len) && max < 512 && s[max]) ++max;
        l_.put("->", 2);
        l_.quoted(std::string(s, max).c_str(), max);
    }
}

void call::out_str(const char* n, const char* const* p, bool ok) {
    key(n);
    l_.hex(reinterpret_cast<uintptr_t>(p));
    if (ok && p) {
        l_.put("->", 2);
        l_.quoted(*p, 512);
    }
}

void call::result(int rc) {
    if (end_ == 0) done();
    l_.put(") = ", 4);
    if (const char* s = result_name(rc))
        l_.put(s);
    else
        l_.dec(rc);
    char b[40];
    uint64_t dt = end_ - start_;
    int k = std::snprintf(b, sizeof b, " %llu.%01lluus", static_cast<unsigned long long>(dt / 1000),
                          static_cast<unsigned long long>(dt % 1000 / 100));
    l_.put(b, static_cast<size_t>(k));
    if (note_) l_.put(note_);
}

}  // namespace vcuda::client::trace
