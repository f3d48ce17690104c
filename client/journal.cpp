#include "client/journal.hpp"

namespace vcuda::client {

void journal::made(op o, std::span<const uint64_t> args, uint64_t made) {
    std::lock_guard lock(mu_);
    if (!at_.emplace(made, next_).second) return;
    entries_.emplace(next_++, journal_entry{o, {args.begin(), args.end()}, made});
}

void journal::ended(uint64_t made) {
    std::lock_guard lock(mu_);
    auto it = at_.find(made);
    if (it == at_.end()) return;
    entries_.erase(it->second);
    at_.erase(it);
}

std::vector<journal_entry> journal::entries() const {
    std::lock_guard lock(mu_);
    std::vector<journal_entry> out;
    out.reserve(entries_.size());
    for (const auto& [order, e] : entries_) out.push_back(e);
    return out;
}

}  // namespace vcuda::client
