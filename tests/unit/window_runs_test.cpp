// The address window's free runs (server/window_runs.hpp): what a server hands out to its sessions' memory
// and to the programs' own VMM reservations, and claims for sessions moved to it.
#include "server/window_runs.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include "server/host_window.hpp"

using vcuda::server::window_runs;

namespace {
constexpr uint64_t mib2 = 2u << 20;
constexpr uint64_t base = 0x10004000000;  // as on the H200
}  // namespace

TEST_CASE("window runs: aligned takes, give-backs that merge, claims of moved ranges", "[unit]") {
    window_runs w;
    CHECK(w.take(mib2) == 0);  // not started: nothing to hand out
    w.start(base, 1);
    const uint64_t mine = base + window_runs::span;
    REQUIRE(w.first() == mine);
    const uint64_t a = w.take(mib2, mib2);
    CHECK(a == mine);
    // 1 GiB aligned: the run before the aligned start stays free and is handed out next.
    const uint64_t big = w.take(uint64_t{1} << 30, uint64_t{1} << 30);
    CHECK(big % (uint64_t{1} << 30) == 0);
    CHECK(big > a);
    CHECK(w.take(mib2, mib2) == a + mib2);
    // Given back, the pieces merge into one run again: a take of the whole window succeeds.
    w.give_back(a, mib2);
    w.give_back(a + mib2, mib2);
    w.give_back(big, uint64_t{1} << 30);
    CHECK(w.take(window_runs::span, mib2) == mine);
    w.give_back(mine, window_runs::span);
    // Too large for the window: nothing.
    CHECK(w.take(window_runs::span + mib2, mib2) == 0);
    // A moved session's range: in another server's window it is claimed without being this one's; in this
    // one only while free; outside the common range never.
    CHECK(w.claim(base, mib2));
    CHECK(w.claim(mine, mib2));
    CHECK(!w.claim(mine, mib2));
    CHECK(!w.claim(base - mib2, mib2));
    CHECK(w.take(mib2, mib2) == mine + mib2);
    // Two moved sessions may not hold the same addresses of another server's window (they came from two
    // processes that both used them); given back, the range may be claimed again, and is never handed out.
    CHECK(!w.claim(base, 2 * mib2));
    CHECK(!w.claim(base + mib2 / 2, mib2));
    CHECK(w.claim(base + mib2, mib2));
    w.give_back(base, mib2);
    CHECK(w.claim(base, mib2));
    CHECK(w.take(mib2, mib2) == mine + 2 * mib2);
    // A session that moved away keeps its ranges: nobody else gets them, and it may claim them once when it
    // comes back; the same for a range of another server's window it held here.
    const uint64_t gone = w.take(mib2, mib2);
    w.keep(gone, mib2);
    w.keep(base, mib2);
    CHECK(w.take(mib2, mib2) != gone);
    CHECK(!w.claim(gone, 2 * mib2));
    CHECK(w.claim(gone, mib2));
    CHECK(!w.claim(gone, mib2));
    CHECK(w.claim(base, mib2));
    CHECK(!w.claim(base, mib2));
}

TEST_CASE("a host window takes another index only while nothing was mapped in it", "[unit]") {
    vcuda::server::host_window w(3);
    REQUIRE(w.reassign(5));  // the manager's window for a server at --address-window auto
    const int fd = memfd_create("window-test", 0);
    REQUIRE(fd >= 0);
    REQUIRE(ftruncate(fd, mib2) == 0);
    void* p = w.map(fd, mib2);
    if (!p) {
        WARN("the common range of host addresses is taken in this process: nothing to check");
    } else {
        // Mapped in window 5, not 3; from now on the index stays.
        const auto at = reinterpret_cast<uintptr_t>(p);
        const uintptr_t five = vcuda::server::host_window::common_base + 5 * window_runs::span;
        CHECK(at >= five);
        CHECK(at < five + window_runs::span);
        CHECK_FALSE(w.reassign(6));
        CHECK(w.unmap(at, mib2));
    }
    CHECK_FALSE(w.reassign(window_runs::count));
    close(fd);
}
