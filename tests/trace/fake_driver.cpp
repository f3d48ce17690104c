// Hand-written part of the fake driver: versions, initialization and the export tables the tests wrap.
#include "fake_driver.hpp"

#include <cstddef>
#include <cstring>
#include <utility>

#define FAKE_API extern "C" __attribute__((visibility("default"))) int

extern "C" {
const char* fake_last_call = nullptr;
int fake_call_count = 0;
}

int fake_record(const char* name) {
    fake_last_call = name;
    ++fake_call_count;
    return 999;
}

namespace {

using word = uintptr_t;

// Slot s of the tools-context table (21318c60): writes {a1, a1+1, a1+2, a1+3} to a0 when it is not null and
// answers 100 + s + a2.
template <int S>
word tools_slot(word a0, word a1, word a2, word, word, word) {
    if (a0) {
        auto* out = reinterpret_cast<uint64_t*>(a0);
        for (int i = 0; i < 4; ++i) out[i] = a1 + static_cast<word>(i);
    }
    return 100 + S + a2;
}

template <size_t... S>
void fill_tools(word* t, std::index_sequence<S...>) {
    ((t[S + 1] = reinterpret_cast<word>(&tools_slot<static_cast<int>(S + 1)>)), ...);
}

word tools_table[93];

// Context-local storage (c693336e, no size word): [2] get(&value, ctx, key) answers value = key * 2.
word cls_put(word, word, word, word, word, word) { return 0; }
word cls_delete(word, word, word, word, word, word) { return 0; }
word cls_get(word value, word, word key, word, word, word) {
    if (value) *reinterpret_cast<word*>(value) = key * 2;
    return 0;
}
word cls_table[3] = {reinterpret_cast<word>(&cls_put), reinterpret_cast<word>(&cls_delete),
                     reinterpret_cast<word>(&cls_get)};

// The two tables record mode must hand back untouched.
word zero_slot(word, word, word, word, word, word) { return 0; }
word cudart_table[13];
word integrity_table[3];

// A listed table (callbacks, a094798c: 7 slots listed) whose size word says 9: words 7 and 8 stay untraced.
word callbacks_table[9];

// Two tables nobody lists: one with a size word and a data word, one without a size word.
word unlisted_data = 42;
word sum_slot(word a0, word a1, word a2, word a3, word a4, word a5) { return a0 + a1 + a2 + a3 + a4 + a5; }
word unlisted_sized[5] = {5 * sizeof(word), reinterpret_cast<word>(&sum_slot),
                          reinterpret_cast<word>(&unlisted_data), reinterpret_cast<word>(&zero_slot), 0};
word unlisted_plain[4] = {reinterpret_cast<word>(&sum_slot), reinterpret_cast<word>(&zero_slot),
                          reinterpret_cast<word>(&sum_slot), 0};

struct table_entry {
    unsigned char id[16];
    word* table;
};

table_entry tables[] = {
    {{0x21, 0x31, 0x8c, 0x60, 0x97, 0x14, 0x32, 0x48, 0x8c, 0xa6, 0x41, 0xff, 0x73, 0x24, 0xc8, 0xf2},
     tools_table},
    {{0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11, 0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93},
     cls_table},
    {{0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9},
     cudart_table},
    {{0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34, 0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2},
     integrity_table},
    {{0xa0, 0x94, 0x79, 0x8c, 0x2e, 0x74, 0x2e, 0x74, 0x93, 0xf2, 0x08, 0x00, 0x20, 0x0c, 0x0a, 0x66},
     callbacks_table},
    {{0x01, 0x02, 0x03, 0x04, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, unlisted_sized},
    {{0x05, 0x06, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2}, unlisted_plain},
};

struct init_tables {
    init_tables() {
        tools_table[0] = sizeof tools_table;
        fill_tools(tools_table, std::make_index_sequence<92>());
        cudart_table[0] = sizeof cudart_table;
        integrity_table[0] = sizeof integrity_table;
        for (int i = 1; i < 13; ++i) cudart_table[i] = reinterpret_cast<word>(&zero_slot);
        integrity_table[1] = integrity_table[2] = reinterpret_cast<word>(&zero_slot);
        callbacks_table[0] = sizeof callbacks_table;
        for (int i = 1; i < 9; ++i) callbacks_table[i] = reinterpret_cast<word>(&sum_slot);
    }
} init;

}  // namespace

FAKE_API cuInit(unsigned int) {
    fake_record("cuInit");
    return 0;
}

FAKE_API cuDriverGetVersion(int* v) {
    fake_record("cuDriverGetVersion");
    if (!v) return 1;
    *v = 13000;
    return 0;
}

FAKE_API cuGetExportTable(const void** table, const unsigned char* id) {
    fake_record("cuGetExportTable");
    if (!table || !id) return 1;
    for (auto& t : tables) {
        if (std::memcmp(t.id, id, 16) == 0) {
            *table = t.table;
            return 0;
        }
    }
    return 500;  // CUDA_ERROR_NOT_FOUND
}
