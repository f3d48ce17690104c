#include "server/control_messages.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace vcuda::server {

bool send_message(int sock, const std::vector<std::byte>& m, std::span<const int> fds) {
    iovec iov{const_cast<std::byte*>(m.data()), m.size()};
    msghdr h{};
    h.msg_iov = &iov;
    h.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
    if (fds.size() > 4) return false;
    if (!fds.empty()) {
        h.msg_control = control;
        h.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
        cmsghdr* c = CMSG_FIRSTHDR(&h);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
        std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    ssize_t n;
    do n = ::sendmsg(sock, &h, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n == static_cast<ssize_t>(m.size());
}

int receive_message(int sock, std::vector<std::byte>& m, std::vector<int>& fds, size_t max_fds) {
    m.resize(max_message_bytes);
    iovec iov{m.data(), m.size()};
    msghdr h{};
    h.msg_iov = &iov;
    h.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
    h.msg_control = control;
    h.msg_controllen = sizeof control;
    ssize_t n;
    do n = ::recvmsg(sock, &h, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    fds.clear();
    if (n <= 0) return n == 0 ? 0 : -1;
    for (cmsghdr* c = CMSG_FIRSTHDR(&h); c; c = CMSG_NXTHDR(&h, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t k = 0; k < count; ++k) {
            int got;
            std::memcpy(&got, CMSG_DATA(c) + k * sizeof(int), sizeof got);
            if (fds.size() < max_fds)
                fds.push_back(got);
            else
                ::close(got);
        }
    }
    m.resize(static_cast<size_t>(n));
    return 1;
}

int receive_message(int sock, std::vector<std::byte>& m, int& fd) {
    std::vector<int> fds;
    int r = receive_message(sock, m, fds, 1);
    fd = fds.empty() ? -1 : fds.front();
    return r;
}

}  // namespace vcuda::server
