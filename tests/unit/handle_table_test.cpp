// The server's handle table (server/handle_table.hpp): typed, generation-checked ids, and dependents (a
// graph's nodes, a module's functions) erased with their owner, so that no id outlives what held it.
#include <catch2/catch.hpp>

#include "server/handle_table.hpp"

using namespace vcuda;
using namespace vcuda::server;

namespace {
void* raw(uintptr_t v) { return reinterpret_cast<void*>(v); }

handle_entry entry(handle_kind k, uintptr_t driver_object, uint64_t owner = 0) {
    handle_entry e;
    e.kind = k;
    e.raw = raw(driver_object);
    e.owner = owner;
    e.owned = owner != 0;
    return e;
}
}  // namespace

TEST_CASE("erasing a graph erases its nodes, and their ids are never valid again", "[unit]") {
    handle_table t;
    t.set_tag(3);
    uint64_t other = t.insert(entry(handle_kind::stream, 0x10));
    uint64_t g = t.insert(entry(handle_kind::graph, 0x20));
    uint64_t n1 = t.insert_derived(entry(handle_kind::graph_node, 0x30, g));
    uint64_t n2 = t.insert_derived(entry(handle_kind::graph_node, 0x40, g));
    CHECK(t.size() == 4);
    // Listing a node again gives the id it has.
    CHECK(t.insert_derived(entry(handle_kind::graph_node, 0x30, g)) == n1);
    CHECK(t.size() == 4);
    CHECK(t.find(n1, handle_kind::graph_node) != nullptr);
    CHECK(t.find(n1, handle_kind::graph) == nullptr);

    // One node alone.
    CHECK(t.erase(n2));
    CHECK(t.find(n2, handle_kind::graph_node) == nullptr);
    CHECK(!t.erase(n2));
    CHECK(t.size() == 3);

    CHECK(t.erase(g));
    CHECK(t.size() == 1);
    CHECK(t.find(n1, handle_kind::graph_node) == nullptr);
    CHECK(t.find(other, handle_kind::stream) != nullptr);

    // The driver reuses a node's address in a new graph: a new id, the old one stays stale.
    uint64_t g2 = t.insert(entry(handle_kind::graph, 0x20));
    uint64_t n3 = t.insert_derived(entry(handle_kind::graph_node, 0x30, g2));
    CHECK(n3 != n1);
    CHECK(t.find(n1, handle_kind::graph_node) == nullptr);
    CHECK(t.find(n3, handle_kind::graph_node) != nullptr);
    CHECK(t.size() == 3);
}

TEST_CASE("dependents are erased at every level: a library's kernels and their functions", "[unit]") {
    handle_table t;
    uint64_t lib = t.insert(entry(handle_kind::library, 0x100));
    uint64_t k = t.insert_derived(entry(handle_kind::kernel, 0x110, lib));
    uint64_t f = t.insert_derived(entry(handle_kind::function, 0x120, k));
    uint64_t m = t.insert_derived(entry(handle_kind::module, 0x130, lib));
    uint64_t unrelated = t.insert(entry(handle_kind::event, 0x140));
    CHECK(t.size() == 5);
    CHECK(t.erase(lib));
    CHECK(t.size() == 1);
    CHECK(t.find(k, handle_kind::kernel) == nullptr);
    CHECK(t.find(f, handle_kind::function) == nullptr);
    CHECK(t.find(m, handle_kind::module) == nullptr);
    CHECK(t.find(unrelated, handle_kind::event) != nullptr);
}

TEST_CASE("a graph given to a node goes with that node, its own nodes with it", "[unit]") {
    handle_table t;
    t.set_tag(1);
    uint64_t parent = t.insert(entry(handle_kind::graph, 0x100));
    uint64_t child = t.insert(entry(handle_kind::graph, 0x200));
    uint64_t inner = t.insert_derived(entry(handle_kind::graph_node, 0x210, child));
    uint64_t holder = t.insert_derived(entry(handle_kind::graph_node, 0x110, parent));
    // Before: the child graph is the application's.
    CHECK(!t.find(child, handle_kind::graph)->owned);
    t.give_to(child, holder);
    const auto* e = t.find(child, handle_kind::graph);
    REQUIRE(e != nullptr);
    CHECK(e->owned);
    CHECK(e->owner == holder);
    // Giving it again moves it, without leaving it among the first owner's dependents.
    uint64_t other = t.insert_derived(entry(handle_kind::graph_node, 0x120, parent));
    t.give_to(child, other);
    CHECK(t.erase(holder));
    CHECK(t.find(child, handle_kind::graph) != nullptr);
    // Erasing the parent erases the node that holds the child graph, the child graph and its node.
    CHECK(t.erase(parent));
    CHECK(t.find(other, handle_kind::graph_node) == nullptr);
    CHECK(t.find(child, handle_kind::graph) == nullptr);
    CHECK(t.find(inner, handle_kind::graph_node) == nullptr);
    CHECK(t.size() == 0);
}
