#include "client/parallel_copy.hpp"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

namespace vcuda::client {
namespace {

constexpr size_t min_piece = 1u << 20;
constexpr unsigned max_helpers = 3;

struct piece {
    char* dst;
    const char* src;
    size_t n;
    int* left;  // the caller's count of pieces not yet copied
};

// The helper threads of one process (a forked child makes its own: the parent's threads are not in it).
class helpers {
  public:
    explicit helpers(unsigned count) : count_(count) {
        for (unsigned i = 0; i < count_; ++i) std::thread([this] { run(); }).detach();
    }
    unsigned count() const { return count_; }

    void copy(char* dst, const char* src, size_t n, unsigned parts) {
        size_t each = (n / parts + 4095) & ~size_t{4095};
        int left = 0;
        {
            std::lock_guard lock(mu_);
            for (size_t off = each; off < n; off += each) {
                queue_.push_back({dst + off, src + off, std::min(each, n - off), &left});
                ++left;
            }
        }
        work_.notify_all();
        std::memcpy(dst, src, std::min(each, n));
        std::unique_lock lock(mu_);
        // Pieces no helper has taken (all busy with other copies) are the caller's.
        for (auto it = queue_.begin(); it != queue_.end();) {
            if (it->left != &left) {
                ++it;
                continue;
            }
            piece p = *it;
            it = queue_.erase(it);
            lock.unlock();
            std::memcpy(p.dst, p.src, p.n);
            lock.lock();
            --left;
            it = queue_.begin();
        }
        done_.wait(lock, [&] { return left == 0; });
    }

  private:
    void run() {
        std::unique_lock lock(mu_);
        for (;;) {
            work_.wait(lock, [&] { return !queue_.empty(); });
            piece p = queue_.front();
            queue_.pop_front();
            lock.unlock();
            std::memcpy(p.dst, p.src, p.n);
            lock.lock();
            if (--*p.left == 0) done_.notify_all();
        }
    }

    unsigned count_;
    std::mutex mu_;
    std::condition_variable work_, done_;
    std::deque<piece> queue_;
};

helpers* process_helpers() {
    static std::mutex mu;
    static helpers* h = nullptr;  // never destroyed: its threads live until the process ends
    static pid_t owner = 0;
    std::lock_guard lock(mu);
    if (!h || owner != getpid()) {
        unsigned cores = std::thread::hardware_concurrency();
        h = new helpers(std::min(max_helpers, cores > 1 ? cores - 1 : 0));
        owner = getpid();
    }
    return h;
}

}  // namespace

void parallel_copy(void* dst, const void* src, size_t n) {
    if (n < 2 * min_piece) {
        std::memcpy(dst, src, n);
        return;
    }
    helpers* h = process_helpers();
    unsigned parts = static_cast<unsigned>(std::min<size_t>(h->count() + 1, n / min_piece));
    if (parts < 2) {
        std::memcpy(dst, src, n);
        return;
    }
    h->copy(static_cast<char*>(dst), static_cast<const char*>(src), n, parts);
}

}  // namespace vcuda::client
