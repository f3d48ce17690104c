#include "client/trace_tables.hpp"

#include <errno.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <utility>

#include "client/trace_log.hpp"

namespace vcuda::client::trace {

int deref_args = 6;
int deref_words = 4;

namespace {

constexpr int max_words =
    128;  // the most words copied from a table, and the shims of a table not listed below

struct known_table {
    unsigned char id[16];
    int words;  // words, the size word included, as ../shared/reference/driver-interface.md §2 lists them
    int size_word;  // 1: word 0 is the size in bytes; 0: no size word (context-local storage)
    int instance;   // the shim set it uses, or -1: handed back untouched
    const char* why;
};

// The tables of the reference. Two are never copied: cudart checks the integrity digest (d4082055 slot 1)
// against the addresses of the integrity table, of its slot 1 and of the cudart interface table (6bd5fb6c)
// as they were handed to it, while the real driver computes it over its own: a copy of either fails
// cudart's start with error 103 ("integrity checks failed"). Their slots are not traced.
constexpr known_table known[] = {
    {{0xf8, 0xcf, 0xf9, 0x51, 0x21, 0x46, 0x8b, 0x4e, 0xb9, 0xe2, 0xfb, 0x46, 0x9e, 0x7c, 0x0d, 0xd9},
     3,
     1,
     0,
     nullptr},
    {{0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9},
     13,
     1,
     -1,
     "cudart interface: the integrity digest covers its address"},
    {{0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66},
     7,
     1,
     1,
     nullptr},
    {{0x42, 0xd8, 0x5a, 0x81, 0x23, 0xf6, 0xcb, 0x47, 0x82, 0x98, 0xf6, 0xe7, 0x8a, 0x3a, 0xec, 0xdc},
     3,
     1,
     2,
     nullptr},
    {{0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93},
     3,
     0,
     3,
     nullptr},
    {{0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43, 0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e},
     15,
     1,
     4,
     nullptr},
    {{0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2},
     3,
     1,
     -1,
     "integrity check: cudart verifies its digest against the addresses it was given"},
    {{0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2},
     93,
     1,
     5,
     nullptr},
    {{0x17, 0x34, 0xdc, 0x26, 0x80, 0x0d, 0x47, 0x45, 0x87, 0x26, 0xc0, 0xf1, 0xe7, 0xdd, 0x8b, 0xca},
     17,
     1,
     6,
     nullptr},
    {{0xda, 0x91, 0x51, 0xd3, 0x3a, 0xe6, 0xcc, 0x41, 0xa5, 0xc0, 0x4f, 0x26, 0xd5, 0x33, 0xe3, 0x28},
     7,
     1,
     7,
     nullptr},
    {{0x69, 0xa2, 0x8e, 0x9f, 0x24, 0x49, 0x8b, 0x47, 0xb0, 0x30, 0xc5, 0xda, 0x33, 0x0e, 0xa9, 0xe9},
     34,
     1,
     8,
     nullptr},
};

// Shim sets: one per listed table that is copied (its word count), then a pool for tables nobody has listed.
constexpr int unknown_first = 9;
constexpr int instance_count = 13;
constexpr int capacity[instance_count] = {3, 7,  3,         3,         15,        93,       17,
                                          7, 34, max_words, max_words, max_words, max_words};

struct instance {
    bool used = false;
    unsigned char id[16];
    char label[9];
    const void* real_table = nullptr;
    int words = 0;
    uintptr_t real[max_words] = {};  // the real entry point behind each wrapped slot
    uintptr_t copy[max_words] = {};  // the table handed out
};
instance instances[instance_count];
std::mutex tables_mu;

using shim_fn = uintptr_t (*)(uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t);

uintptr_t slot_call(int t, int s, uintptr_t a0, uintptr_t a1, uintptr_t a2, uintptr_t a3, uintptr_t a4,
                    uintptr_t a5) {
    instance& in = instances[t];
    auto fn = reinterpret_cast<shim_fn>(in.real[s]);
    int d = depth()++;
    uint64_t t0 = now_ns();
    if (enter_lines) {
        line e;
        e.prefix(t0, d);
        e.put("> export ");
        e.put(in.label);
        e.put_char('[');
        e.dec(s);
        e.put_char(']');
        e.emit();
    }
    // What the arguments point to before the call, to show what the slot wrote.
    const uintptr_t a[6] = {a0, a1, a2, a3, a4, a5};
    uint64_t before[6][64];
    bool readable[6] = {};
    for (int i = 0; i < deref_args && i < 6; ++i)
        readable[i] =
            plausible_pointer(a[i]) && safe_read(reinterpret_cast<const void*>(a[i]), before[i],
                                                 sizeof(uint64_t) * static_cast<size_t>(deref_words));
    uintptr_t r = fn(a0, a1, a2, a3, a4, a5);
    uint64_t t1 = now_ns();
    --depth();
    int saved_errno = errno;

    line l;
    l.prefix(t0, d);
    l.put("export ");
    l.put(in.label);
    l.put_char('[');
    l.dec(s);
    l.put("](");
    for (int k = 0; k < 6; ++k) {
        if (k) l.put(", ", 2);
        l.hex(a[k]);
    }
    l.put(") = ");
    l.hex(r);  // the slot's return type is not known: no CUresult name
    char b[40];
    uint64_t dt = t1 - t0;
    int k = std::snprintf(b, sizeof b, " %llu.%01lluus", static_cast<unsigned long long>(dt / 1000),
                          static_cast<unsigned long long>(dt % 1000 / 100));
    l.put(b, static_cast<size_t>(k));
    for (int i = 0; i < deref_args && i < 6; ++i) {
        uint64_t w[64];
        if (!readable[i] || !safe_read(reinterpret_cast<const void*>(a[i]), w,
                                       sizeof(uint64_t) * static_cast<size_t>(deref_words)))
            continue;
        l.put(" *a");
        l.dec(i);
        l.put("=[");
        for (int j = 0; j < deref_words; ++j) {
            if (j) l.put(", ", 2);
            l.hex(w[j]);
            if (w[j] != before[i][j]) {
                l.put("<-", 2);
                l.hex(before[i][j]);
            }
        }
        l.put_char(']');
    }
    l.emit();
    errno = saved_errno;
    return r;
}

template <int T, int S>
uintptr_t shim(uintptr_t a0, uintptr_t a1, uintptr_t a2, uintptr_t a3, uintptr_t a4, uintptr_t a5) {
    return slot_call(T, S, a0, a1, a2, a3, a4, a5);
}

template <int T, size_t... S>
constexpr std::array<shim_fn, sizeof...(S)> shims_of(std::index_sequence<S...>) {
    return {&shim<T, static_cast<int>(S)>...};
}

template <int T>
const shim_fn* shim_set() {
    static constexpr auto set = shims_of<T>(std::make_index_sequence<capacity[T]>());
    return set.data();
}

template <size_t... T>
std::array<const shim_fn*, instance_count> all_shim_sets(std::index_sequence<T...>) {
    return {shim_set<static_cast<int>(T)>()...};
}

const std::array<const shim_fn*, instance_count>& shims() {
    static const auto sets = all_shim_sets(std::make_index_sequence<instance_count>());
    return sets;
}

bool looks_like_size(uintptr_t w0) { return w0 >= 8 && w0 % 8 == 0 && w0 < 0x10000; }

}  // namespace

const void* wrap_export_table(const unsigned char* id, const void* real, code_predicate is_code,
                              std::string& note) {
    std::lock_guard lock(tables_mu);
    const known_table* k = nullptr;
    for (auto& t : known)
        if (std::memcmp(t.id, id, 16) == 0) k = &t;
    if (k && k->instance < 0) {
        note = std::string("real table handed back untouched (") + k->why + ")";
        return real;
    }
    int t = -1;
    if (k) {
        t = k->instance;
    } else {
        for (int i = unknown_first; i < instance_count; ++i) {
            if (instances[i].used && std::memcmp(instances[i].id, id, 16) == 0) {
                t = i;
                break;
            }
        }
        if (t < 0) {
            for (int i = unknown_first; i < instance_count && t < 0; ++i)
                if (!instances[i].used) t = i;
        }
        if (t < 0) {
            note = "real table handed back untraced: more unlisted tables than shim sets";
            return real;
        }
    }
    instance& in = instances[t];
    if (in.used) {
        if (in.real_table != real) {
            note = "the driver answered a different table than before; the first one's copy handed back";
        } else {
            note = "copy made before";
        }
        return in.copy;
    }

    uintptr_t w0 = 0;
    if (!safe_read(real, &w0, sizeof w0)) {
        note = "real table unreadable: handed back untouched";
        return real;
    }
    bool sized = k ? (k->size_word == 1 && looks_like_size(w0)) : looks_like_size(w0);
    int n = 0;
    if (sized) {
        n = static_cast<int>(w0 / sizeof(uintptr_t));
        if (n > max_words) n = max_words;
    } else if (k) {
        n = k->words;
    } else {
        // No size word: the table goes on as long as its words are entry points.
        const auto* words = static_cast<const uintptr_t*>(real);
        while (n < max_words) {
            uintptr_t w;
            if (!safe_read(words + n, &w, sizeof w) || !is_code(reinterpret_cast<const void*>(w))) break;
            ++n;
        }
        if (n == 0) {
            note = "unlisted table without size word or entry points: handed back untouched";
            return real;
        }
    }

    in.used = true;
    std::memcpy(in.id, id, 16);
    std::snprintf(in.label, sizeof in.label, "%02x%02x%02x%02x", id[0], id[1], id[2], id[3]);
    in.real_table = real;
    const auto* words = static_cast<const uintptr_t*>(real);
    int wrapped = 0, data = 0, beyond = 0;
    int copied = 0;
    for (int i = 0; i < n; ++i) {
        uintptr_t w;
        if (!safe_read(words + i, &w, sizeof w)) break;
        ++copied;
        in.copy[i] = w;
        if (i == 0 && sized) continue;  // the size word, as it is
        if (w == 0) continue;
        if (i >= capacity[t]) {
            ++beyond;
            continue;
        }
        if (!is_code(reinterpret_cast<const void*>(w))) {
            ++data;
            continue;
        }
        in.real[i] = w;
        in.copy[i] = reinterpret_cast<uintptr_t>(shims()[t][i]);
        ++wrapped;
    }
    in.words = copied;
    char b[200];
    std::snprintf(b, sizeof b, "copy of %d words%s: %d entry points traced", copied,
                  sized ? " (size word kept)" : " (no size word)", wrapped);
    note = b;
    if (data) note += ", " + std::to_string(data) + " words that are not code copied as they are";
    if (beyond) note += ", " + std::to_string(beyond) + " words past the listed slots copied untraced";
    return in.copy;
}

}  // namespace vcuda::client::trace
