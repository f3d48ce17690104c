// The mirror's journal (client/journal.hpp): the calls that made what is alive, in order, and no more.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <vector>

#include "client/journal.hpp"

using namespace vcuda;
using namespace vcuda::client;

TEST_CASE("the journal keeps what is alive in the order it was made, and no more", "[unit]") {
    journal j;
    const std::array<uint64_t, 1> bytes{4096};
    // A program that allocates and frees for ever: the journal does not grow.
    for (uint64_t i = 0; i < 100000; ++i) {
        j.made(op::mem_alloc, bytes, 0x7f0000000000 + i * 4096);
        j.ended(0x7f0000000000 + i * 4096);
    }
    CHECK(j.entries().empty());

    j.made(op::mem_alloc, bytes, 0xa000);
    j.made(op::module_load, std::array<uint64_t, 2>{1, 2}, 0xb000);
    j.made(op::mem_alloc, bytes, 0xc000);
    j.made(op::mem_alloc, bytes, 0xa000);  // a repeat (a cached answer) is not a second making
    j.ended(0xb000);
    j.ended(0xd000);  // never made: nothing changes
    auto e = j.entries();
    REQUIRE(e.size() == 2);
    CHECK(e[0].made == 0xa000);
    CHECK(e[0].operation == op::mem_alloc);
    CHECK(e[0].args == std::vector<uint64_t>{4096});
    CHECK(e[1].made == 0xc000);
    // Made again after it ended: journaled again, after what is older.
    j.ended(0xa000);
    j.made(op::mem_alloc, bytes, 0xa000);
    e = j.entries();
    REQUIRE(e.size() == 2);
    CHECK(e[0].made == 0xc000);
    CHECK(e[1].made == 0xa000);
}
