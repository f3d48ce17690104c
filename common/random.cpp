#include "common/random.hpp"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

namespace vcuda {

bool os_random(void* buf, size_t n) {
    auto* p = static_cast<unsigned char*>(buf);
    size_t got = 0;
    while (got < n) {
        ssize_t r = ::getrandom(p + got, n - got, 0);
        if (r > 0) {
            got += static_cast<size_t>(r);
            continue;
        }
        if (r < 0 && errno == EINTR) continue;
        break;  // ENOSYS (an old kernel) or a seccomp filter: the device file below
    }
    if (got == n) return true;
    int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    while (got < n) {
        ssize_t r = ::read(fd, p + got, n - got);
        if (r > 0)
            got += static_cast<size_t>(r);
        else if (!(r < 0 && errno == EINTR))
            break;
    }
    ::close(fd);
    return got == n;
}

std::string os_random_bytes(size_t n) {
    std::string s(n, '\0');
    if (!os_random(s.data(), n)) {
        std::fputs(
            "vcuda: the system's random number generator (getrandom, /dev/urandom) gave nothing; cannot make "
            "a secret\n",
            stderr);
        std::abort();
    }
    return s;
}

uint64_t os_random_u64() {
    uint64_t v;
    std::string s = os_random_bytes(sizeof v);
    __builtin_memcpy(&v, s.data(), sizeof v);
    return v;
}

bool equal_constant_time(std::string_view a, std::string_view b) {
    if (a.size() != b.size()) return false;
    volatile unsigned char diff = 0;
    for (size_t i = 0; i < a.size(); ++i) diff = diff | static_cast<unsigned char>(a[i] ^ b[i]);
    return diff == 0;
}

}  // namespace vcuda
