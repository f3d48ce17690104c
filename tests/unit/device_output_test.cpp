// Device printf's routing (server/device_output.hpp): a thread's capture takes what it writes; what a thread
// without one writes (the driver's own, for kernels no synchronize claimed in time) goes to the only
// claimant, and to no session when there are several.
#include "server/device_output.hpp"

#include <catch2/catch.hpp>
#include <cstdio>
#include <string>
#include <thread>

namespace output = vcuda::server::device_output;

namespace {
// Writes `text` to stdout from a new thread, as the driver's own thread would.
void write_from_another_thread(const char* text) {
    std::thread([text] { std::fputs(text, stdout); }).join();
}
}  // namespace

TEST_CASE("device output: captures nest, the sole claimant takes unclaimed lines, several take none",
          "[unit]") {
    output::install();
    std::string a_got, b_got;
    {
        output::claimant a([&](std::string_view t) { a_got.append(t); });
        write_from_another_thread("line for a\n");
        CHECK(a_got == "line for a\n");
        {
            output::claimant b([&](std::string_view t) { b_got.append(t); });
            write_from_another_thread("[device_output_test: a line no session may take]\n");
            CHECK(a_got == "line for a\n");
            CHECK(b_got.empty());
        }
        write_from_another_thread("again for a\n");
        CHECK(a_got == "line for a\nagain for a\n");
        // A thread's capture comes first; a nested one ends into the outer one again.
        std::string lane, save;
        std::thread([&] {
            output::capture outer(lane);
            std::fputs("lane 1\n", stdout);
            {
                output::capture inner(save);
                std::fputs("saved\n", stdout);
            }
            std::fputs("lane 2\n", stdout);
        }).join();
        CHECK(lane == "lane 1\nlane 2\n");
        CHECK(save == "saved\n");
        CHECK(a_got == "line for a\nagain for a\n");
    }
    output::claimant c([&](std::string_view t) { b_got.append(t); });  // a's gone: c alone
    write_from_another_thread("for c\n");
    CHECK(b_got == "for c\n");
}
