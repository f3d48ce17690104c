#include "server/control_messages.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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

bool ask_parent(int control, const std::vector<std::byte>& m, int fd, std::vector<std::byte>& reply,
                std::vector<int>& fds, std::string& why) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
        why = std::string("no socket pair: ") + std::strerror(errno);
        return false;
    }
    int pass[2] = {sv[1], fd};
    const bool sent = send_message(control, m, std::span<const int>(pass, fd >= 0 ? 2 : 1));
    ::close(sv[1]);
    if (!sent) {
        ::close(sv[0]);
        why = "the server process is gone";
        return false;
    }
    pollfd p{sv[0], POLLIN, 0};
    int k;
    do k = ::poll(&p, 1, 10000);
    while (k < 0 && errno == EINTR);
    const bool got = k > 0 && receive_message(sv[0], reply, fds, 1) == 1;
    ::close(sv[0]);
    if (!got) why = "no answer from the server process";
    return got;
}

}  // namespace vcuda::server
