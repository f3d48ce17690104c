// A session's handles: one typed table, ids = kind | generation | index (common/handle_kind.hpp), so a stale,
// foreign or forged id is refused without touching the driver. Freed slots are reused with a new generation.
// An `owned` entry depends on its owner (a module's functions, a library's kernels, a graph's nodes): erasing
// the owner erases its dependents too, so no id outlives the object that held it. locks: none inside; the
// session's mutex guards it.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/handle_kind.hpp"
#include "common/param_layout.hpp"

namespace vcuda::server {

struct handle_entry {
    handle_kind kind = handle_kind::none;
    void* raw = nullptr;  // the real driver's handle
    int device = 0;       // the session's device index it belongs to
    uint64_t owner = 0;   // module/library of functions, kernels, library modules; graph of nodes
    bool owned = false;   // destroyed with its owner, never on its own
    std::shared_ptr<const param_layout> layout;
    // The op that made it and its first scalar arguments (an event's flags), so that a suspended session can
    // make it again (server/session_image.cpp).
    uint32_t made_by = 0;
    std::array<uint64_t, 2> made_with{};
};

class handle_table {
  public:
    // Bits 52-55 of every id carry the session's tag (chosen by the client, see Hello.handle_tag).
    static constexpr int tag_shift = 52;
    static constexpr uint32_t generation_limit = 1u << 20;
    void set_tag(uint32_t tag) { tag_ = uint64_t{tag & 0xf} << tag_shift; }

    uint64_t insert(handle_entry e) {
        uint32_t index;
        if (!free_.empty()) {
            index = free_.back();
            free_.pop_back();
        } else {
            index = static_cast<uint32_t>(slots_.size());
            slots_.push_back({});
        }
        auto& s = slots_[index];
        s.entry = std::move(e);
        s.live = true;
        uint64_t id = make_handle(s.entry.kind, s.generation, index) | tag_;
        if (s.entry.owned && s.entry.owner) dependents_[s.entry.owner].insert(id);
        return id;
    }

    // For handles derived from a module, library or graph (its functions, kernels, modules, nodes): the id
    // already given for the same driver object and owner, else a new one. Asking again (PyTorch asks
    // cuKernelGetFunction at each launch, a graph's nodes may be listed many times) must not grow the table.
    uint64_t insert_derived(handle_entry e) {
        auto key = std::make_pair(e.raw, e.kind);
        if (auto it = derived_.find(key); it != derived_.end()) {
            auto* old = find(it->second, e.kind);
            if (old && old->owner == e.owner) return it->second;
        }
        uint64_t id = insert(std::move(e));
        derived_[key] = id;
        return id;
    }

    // The entry for `id` if it is live and of kind `k` (or `alt`, when given).
    handle_entry* find(uint64_t id, handle_kind k, handle_kind alt = handle_kind::none) {
        if ((id & (uint64_t{0xf} << tag_shift)) != tag_) return nullptr;
        id &= ~(uint64_t{0xf} << tag_shift);
        uint32_t index = handle_index(id);
        if (index >= slots_.size()) return nullptr;
        auto& s = slots_[index];
        if (!s.live || s.generation != handle_generation(id) || kind_of(id) != s.entry.kind) return nullptr;
        if (s.entry.kind != k && (alt == handle_kind::none || s.entry.kind != alt)) return nullptr;
        return &s.entry;
    }

    // Erases `id` and, recursively, everything that depends on it.
    bool erase(uint64_t id) {
        if ((id & (uint64_t{0xf} << tag_shift)) != tag_) return false;
        const uint64_t bare = id & ~(uint64_t{0xf} << tag_shift);
        uint32_t index = handle_index(bare);
        if (index >= slots_.size() || !slots_[index].live ||
            slots_[index].generation != handle_generation(bare))
            return false;
        auto& s = slots_[index];
        if (auto it = derived_.find({s.entry.raw, s.entry.kind}); it != derived_.end() && it->second == id)
            derived_.erase(it);
        unlink(id, s.entry);
        s.live = false;
        s.entry = {};
        s.generation = (s.generation + 1) % generation_limit;
        if (s.generation == 0) s.generation = 1;
        free_.push_back(index);
        if (auto it = dependents_.find(id); it != dependents_.end()) {
            auto doomed = std::move(it->second);
            dependents_.erase(it);
            for (uint64_t d : doomed) erase(d);
        }
        return true;
    }

    // Entry `id` now belongs to `owner` (a child graph moved into its node): erased with it, never on its
    // own.
    void give_to(uint64_t id, uint64_t owner) {
        auto* e = find(id, kind_of(id));
        if (!e) return;
        unlink(id, *e);
        e->owned = true;
        e->owner = owner;
        dependents_[owner].insert(id);
    }

    // The entry `id` stands for a new driver object, or for none (null) while its session is suspended: ids
    // stay, the driver's objects do not (server/session_image.cpp).
    void rebind(uint64_t id, void* raw) {
        auto* e = find(id, kind_of(id));
        if (!e) return;
        if (auto it = derived_.find({e->raw, e->kind}); it != derived_.end() && it->second == id)
            derived_.erase(it);
        if (raw && e->owned && derived_kind(e->kind)) derived_[{raw, e->kind}] = id;
        e->raw = raw;
    }
    // Kinds insert_derived is used for (call_context::out_handle).
    static constexpr bool derived_kind(handle_kind k) {
        return k == handle_kind::function || k == handle_kind::kernel || k == handle_kind::module ||
               k == handle_kind::graph_node;
    }

    // Visits every live entry: f(id, entry).
    template <class F>
    void for_each(F&& f) {
        for (uint32_t i = 0; i < slots_.size(); ++i)
            if (slots_[i].live)
                f(make_handle(slots_[i].entry.kind, slots_[i].generation, i) | tag_, slots_[i].entry);
    }

    // The first live id of kind `k` standing for driver object `raw` (its entry copied to `out` when given);
    // 0 when there is none. Linear: for calls that report a driver object back (a pool, a node's event).
    uint64_t find_raw(handle_kind k, const void* raw, handle_entry* out = nullptr) {
        uint64_t found = 0;
        for_each([&](uint64_t id, handle_entry& e) {
            if (!found && e.kind == k && e.raw == raw) {
                found = id;
                if (out) *out = e;
            }
        });
        return found;
    }

    size_t size() const { return slots_.size() - free_.size(); }
    uint32_t tag() const { return static_cast<uint32_t>(tag_ >> tag_shift); }

    // A session moved to another server (server/session_transfer.cpp): every slot as it is, so that each id
    // keeps its value there; import() rebuilds the table from them (its entries bound to no driver object
    // until the session is rebuilt).
    struct exported_slot {
        uint32_t index = 0;
        uint32_t generation = 1;
        bool live = false;
        handle_entry entry;
    };
    std::vector<exported_slot> export_slots() const {
        std::vector<exported_slot> out;
        out.reserve(slots_.size());
        for (uint32_t i = 0; i < slots_.size(); ++i)
            out.push_back({i, slots_[i].generation, slots_[i].live, slots_[i].entry});
        return out;
    }
    const std::vector<uint32_t>& free_slots() const { return free_; }
    // False when the slots are not a table (indexes out of order, free slots live or repeated).
    bool import(std::vector<exported_slot> slots, std::vector<uint32_t> free) {
        std::vector<slot> made(slots.size());
        for (uint32_t i = 0; i < slots.size(); ++i) {
            auto& e = slots[i];
            if (e.index != i || e.generation == 0 || e.generation >= generation_limit) return false;
            e.entry.raw = nullptr;
            made[i] = {std::move(e.entry), e.generation, e.live};
        }
        std::vector<bool> seen(made.size());
        for (uint32_t f : free) {
            if (f >= made.size() || made[f].live || seen[f]) return false;
            seen[f] = true;
        }
        slots_ = std::move(made);
        free_ = std::move(free);
        derived_.clear();
        dependents_.clear();
        for_each([&](uint64_t id, handle_entry& e) {
            if (e.owned && e.owner) dependents_[e.owner].insert(id);
        });
        return true;
    }

  private:
    // Takes `id` (of entry `e`) out of its owner's dependents.
    void unlink(uint64_t id, const handle_entry& e) {
        if (!e.owned || !e.owner) return;
        if (auto it = dependents_.find(e.owner); it != dependents_.end()) it->second.erase(id);
    }

    struct slot {
        handle_entry entry;
        uint32_t generation = 1;
        bool live = false;
    };
    std::vector<slot> slots_;
    uint64_t tag_ = 0;
    std::vector<uint32_t> free_;
    std::map<std::pair<void*, handle_kind>, uint64_t> derived_;  // insert_derived's ids by driver object
    std::unordered_map<uint64_t, std::unordered_set<uint64_t>> dependents_;  // owner -> its owned entries
};

}  // namespace vcuda::server
