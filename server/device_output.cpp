#include "server/device_output.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <mutex>
#include <set>

#include "common/log.hpp"

namespace vcuda::server::device_output {

namespace {

thread_local std::string* sink = nullptr;

std::mutex claimants_mu;
std::set<const std::function<void(std::string_view)>*> claimants;  // each claimant's take; under claimants_mu

ssize_t write_real_stdout(const char* buf, size_t n) {
    size_t done = 0;
    while (done < n) {
        ssize_t w = ::write(STDOUT_FILENO, buf + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return done ? static_cast<ssize_t>(done) : -1;
        done += static_cast<size_t>(w);
    }
    return static_cast<ssize_t>(n);
}

ssize_t write_out(void*, const char* buf, size_t n) {
    if (sink) {
        if (sink->size() < capture::limit) {
            static const char note[] =
                "\n[vcuda: device printf output beyond 4 MiB between two calls was dropped]\n";
            size_t room = capture::limit - sink->size();
            sink->append(buf, n <= room ? n : room);
            if (n > room) sink->append(note, sizeof note - 1);
        }
        return static_cast<ssize_t>(n);
    }
    {
        std::lock_guard lock(claimants_mu);
        if (claimants.size() == 1) {
            (**claimants.begin())(std::string_view(buf, n));
            return static_cast<ssize_t>(n);
        }
        if (claimants.size() > 1) {
            static std::once_flag noted;
            std::call_once(noted, [] {
                VCUDA_LOG_WARN(
                    "device printf that the driver wrote on its own thread (no synchronize of its "
                    "session within about 20 ms of the kernel's end) went to this server's stdout: with "
                    "several sessions in this process it names none of them (--isolation process gives "
                    "it to its client)");
            });
        }
    }
    return write_real_stdout(buf, n);
}

}  // namespace

void install() {
    static FILE* const routed = [] {
        cookie_io_functions_t io{nullptr, write_out, nullptr, nullptr};
        FILE* f = fopencookie(nullptr, "w", io);
        if (f) {
            setvbuf(f, nullptr, _IONBF, 0);  // each write reaches the lane of the thread that made it
            fflush(stdout);
            stdout = f;
        }
        return f;
    }();
    (void)routed;
}

capture::capture(std::string& into) : outer_(sink) { sink = &into; }
capture::~capture() { sink = outer_; }

claimant::claimant(std::function<void(std::string_view)> take) : take_(std::move(take)) {
    std::lock_guard lock(claimants_mu);
    claimants.insert(&take_);
}

claimant::~claimant() {
    std::lock_guard lock(claimants_mu);
    claimants.erase(&take_);
}

}  // namespace vcuda::server::device_output
