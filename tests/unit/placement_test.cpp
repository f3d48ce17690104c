// Where a moved session's devices run on the server it moved to (server/placement.hpp): the GPU of the same
// index when the grant allows it, else the granted GPUs in order; refused when it uses more than it may have.
#include "server/placement.hpp"

#include <catch2/catch.hpp>

using vcuda::server::place_moved;

TEST_CASE("placement: moved sessions keep their device indices, on any GPU their grant names", "[unit]") {
    std::map<size_t, size_t> placed;
    std::string why;
    // No lease (every GPU granted): each index on its own GPU.
    REQUIRE(place_moved({0, 1}, {}, 2, placed, why));
    CHECK(placed == std::map<size_t, size_t>{{0, 0}, {1, 1}});
    // A lease of GPU 1 of a two-GPU server, for a session of device 0: device 0 runs on GPU 1.
    REQUIRE(place_moved({0}, {1}, 2, placed, why));
    CHECK(placed == std::map<size_t, size_t>{{0, 1}});
    // A session of device 1 (GPU 1 where it came from) to a one-GPU server: on GPU 0, still device 1.
    REQUIRE(place_moved({1}, {}, 1, placed, why));
    CHECK(placed == std::map<size_t, size_t>{{1, 0}});
    // Its grant names its own index: no change.
    REQUIRE(place_moved({1}, {1}, 2, placed, why));
    CHECK(placed == std::map<size_t, size_t>{{1, 1}});
    // Two devices onto GPUs 2 and 3, in order; duplicates count once.
    REQUIRE(place_moved({1, 0, 1}, {3, 2}, 4, placed, why));
    CHECK(placed == std::map<size_t, size_t>{{0, 2}, {1, 3}});
}

TEST_CASE("placement: more devices than the grant, a GPU the server lacks, an index past the bound",
          "[unit]") {
    std::map<size_t, size_t> placed{{7, 7}};
    std::string why;
    CHECK_FALSE(place_moved({0, 1}, {1}, 2, placed, why));
    CHECK_THAT(why, Catch::Contains("uses 2 GPU(s); it may have 1 here"));
    CHECK_FALSE(place_moved({0, 1}, {}, 1, placed, why));
    CHECK_FALSE(place_moved({0}, {5}, 2, placed, why));
    CHECK_FALSE(place_moved({vcuda::server::max_moved_devices}, {}, 1, placed, why));
    CHECK_THAT(why, Catch::Contains("device index"));
    CHECK(placed == std::map<size_t, size_t>{{7, 7}});  // refused: nothing changed
    // Nothing to place (a session that may use no GPU): an empty placement.
    REQUIRE(place_moved({}, {}, 2, placed, why));
    CHECK(placed.empty());
}
