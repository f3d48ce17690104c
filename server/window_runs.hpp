// One server's window of an address range that every server reserves at the same address: device memory
// (address_window, server/device_memory.hpp) and pinned host pages shared with clients (host_window,
// server/host_window.hpp). A session moved here keeps addresses of its old server's window, which this
// server never hands out; its own window's free runs are handed out first fit and merged when given back.
// locks: none; its owner's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>

namespace vcuda::server {

class window_runs {
  public:
    static constexpr size_t total = size_t{16} << 40;
    static constexpr uint32_t count = 64;
    static constexpr size_t span = total / count;  // 256 GiB

    // The common range was reserved at `base` (until then every range is outside it).
    void start(uint64_t base, uint32_t index) {
        base_ = base;
        mine_ = base + index * span;
        free_[mine_] = span;
    }
    uint64_t base() const { return base_; }
    uint64_t first() const { return mine_; }  // where this server's window starts
    // [at, at+size) lies in the common range.
    bool inside(uint64_t at, uint64_t size) const {
        return base_ && at >= base_ && at - base_ <= total && size <= total - (at - base_);
    }
    // A free run of `size` bytes of this window starting at a multiple of `align` (a power of two), taken;
    // 0 when none.
    uint64_t take(uint64_t size, uint64_t align = 1) {
        for (auto it = free_.begin(); it != free_.end(); ++it) {
            auto [at, len] = *it;
            const uint64_t start = (at + align - 1) & ~(align - 1);
            if (start - at > len || len - (start - at) < size) continue;
            free_.erase(it);
            if (start > at) free_[at] = start - at;
            if (at + len > start + size) free_[start + size] = at + len - (start + size);
            return start;
        }
        return 0;
    }
    // A moved session's range: true when it lies in the common range and is free, in this server's window or
    // in another's (no other moved session holds any of it); taken for it then.
    bool claim(uint64_t at, uint64_t size) {
        if (!inside(at, size)) return false;
        // A range a session that moved away from here kept: the same session coming back.
        if (auto k = kept_.find(at); k != kept_.end() && k->second == size) {
            kept_.erase(k);
            if (at + size <= mine_ || at >= mine_ + span) foreign_[at] = size;
            return true;
        }
        if (at + size <= mine_ || at >= mine_ + span) {
            auto next = foreign_.lower_bound(at);
            if (next != foreign_.end() && next->first < at + size) return false;
            if (next != foreign_.begin() && std::prev(next)->first + std::prev(next)->second > at)
                return false;
            foreign_[at] = size;
            return true;
        }
        auto it = free_.upper_bound(at);
        if (it == free_.begin()) return false;
        --it;
        auto [run, len] = *it;
        if (at + size > run + len) return false;
        free_.erase(it);
        if (at > run) free_[run] = at - run;
        if (run + len > at + size) free_[at + size] = run + len - (at + size);
        return true;
    }
    // A range of a session that moved away: handed out to nobody, but claimable again by a session that
    // brings exactly this range back (the same one, moved back here).
    void keep(uint64_t at, uint64_t size) {
        if (!base_) return;
        foreign_.erase(at);
        kept_[at] = size;
    }
    // Free again, merged with its neighbours. A range of another server's window (a moved session's) was
    // never this one's to hand out: it is only free for another moved session again.
    void give_back(uint64_t at, uint64_t size) {
        if (!base_) return;
        if (at < mine_ || at - mine_ >= span || size > span - (at - mine_)) {
            if (auto it = foreign_.find(at); it != foreign_.end() && it->second == size) foreign_.erase(it);
            return;
        }
        auto next = free_.lower_bound(at);
        if (next != free_.end() && next->first == at + size) {
            size += next->second;
            next = free_.erase(next);
        }
        if (next != free_.begin()) {
            auto prev = std::prev(next);
            if (prev->first + prev->second == at) {
                prev->second += size;
                return;
            }
        }
        free_[at] = size;
    }

  private:
    uint64_t base_ = 0;
    uint64_t mine_ = 0;
    std::map<uint64_t, uint64_t> free_;     // free runs of this server's window: start -> length
    std::map<uint64_t, uint64_t> foreign_;  // ranges of other servers' windows moved sessions hold here
    std::map<uint64_t, uint64_t> kept_;     // ranges of sessions that moved away (keep)
};

}  // namespace vcuda::server
