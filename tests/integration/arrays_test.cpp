// CUDA arrays, texture and surface objects between two sessions (server/handlers_array.cpp): neither can use
// the other's arrays or objects, copies stay inside an array's extent, malformed descriptors are refused, an
// array is charged to the quota, and the server keeps serving throughout.
#include <catch2/catch.hpp>

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "raw_client.hpp"

using namespace vcuda;
using namespace vcuda::test;

namespace {

template <class T>
std::vector<std::byte> bytes(const T& v) {
    std::vector<std::byte> out(sizeof v);
    std::memcpy(out.data(), &v, sizeof v);
    return out;
}

// A 2D float array of w x h (flags: CUDA_ARRAY3D_*), through array_create's 3D form.
raw_reply make_array(raw_client& c, uint64_t w, uint64_t h, uint64_t flags = 0) {
    return c.call(op::array_create, {w, h, 0, CU_AD_FORMAT_FLOAT, 1, flags, 1});
}

// copy_3d between host bytes (packed) and an array: {kind, ptr, x, y, z, pitch, height} per side.
raw_reply to_array(raw_client& c, uint64_t array, uint64_t x, uint64_t y, uint64_t z, uint64_t w, uint64_t h,
                   uint64_t d) {
    std::vector<std::byte> data(w * h * d, std::byte{0x5a});
    return c.call(op::copy_3d, {0, 0, 0, 0, 0, w, h, 2, array, x, y, z, 0, 0, w, h, d, 0}, {}, data);
}
raw_reply from_array(raw_client& c, uint64_t array, uint64_t w, uint64_t h) {
    return c.call(op::copy_3d, {2, array, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, w, h, w, h, 1, 0});
}

std::vector<std::byte> tex_desc() {
    CUDA_TEXTURE_DESC t{};
    t.addressMode[0] = t.addressMode[1] = CU_TR_ADDRESS_MODE_CLAMP;
    t.filterMode = CU_TR_FILTER_MODE_POINT;
    t.flags = CU_TRSF_READ_AS_INTEGER;
    return bytes(t);
}
std::vector<std::byte> array_resource(uint64_t array) {
    CUDA_RESOURCE_DESC r{};
    r.resType = CU_RESOURCE_TYPE_ARRAY;
    r.res.array.hArray = reinterpret_cast<CUarray>(array);
    return bytes(r);
}
std::vector<std::byte> linear_resource(uint64_t ptr, uint64_t size) {
    CUDA_RESOURCE_DESC r{};
    r.resType = CU_RESOURCE_TYPE_LINEAR;
    r.res.linear.devPtr = ptr;
    r.res.linear.format = CU_AD_FORMAT_FLOAT;
    r.res.linear.numChannels = 1;
    r.res.linear.sizeInBytes = size;
    return bytes(r);
}

}  // namespace

TEST_CASE("arrays and texture and surface objects are their session's own, copies stay inside an array",
          "[integration]") {
    server_process server;
    auto a = raw_client::open(server.address());
    auto b = raw_client::open(server.address());
    REQUIRE(a);
    REQUIRE(b);
    const uint64_t w = 64, h = 32, row = w * 4;
    // Ids are per session: B makes one more array first, so that its array's id names nothing in A.
    REQUIRE(make_array(*b, 4, 4).result == CUDA_SUCCESS);
    auto ra = make_array(*a, w, h);
    auto rb = make_array(*b, w, h, CUDA_ARRAY3D_SURFACE_LDST);
    REQUIRE(ra.result == CUDA_SUCCESS);
    REQUIRE(rb.result == CUDA_SUCCESS);
    uint64_t arr_a = ra.outs.at(0), arr_b = rb.outs.at(0);

    // B's bytes in B's array, read back.
    std::vector<std::byte> data(row * h);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 13);
    REQUIRE(b->call(op::copy_3d, {0, 0, 0, 0, 0, row, h, 2, arr_b, 0, 0, 0, 0, 0, row, h, 1, 0}, {}, data)
                .result == CUDA_SUCCESS);
    auto back = from_array(*b, arr_b, row, h);
    REQUIRE(back.result == CUDA_SUCCESS);
    CHECK(back.payload == data);
    auto desc = b->call(op::array_descriptor, {arr_b});
    REQUIRE(desc.result == CUDA_SUCCESS);
    CHECK(desc.outs == std::vector<uint64_t>{w, h, 0, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_SURFACE_LDST});

    // B's array from A: no copy, descriptor, destroy, texture or surface.
    CHECK(to_array(*a, arr_b, 0, 0, 0, 16, 1, 1).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(from_array(*a, arr_b, row, h).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(a->call(op::array_descriptor, {arr_b}).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(a->call(op::array_destroy, {arr_b}).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(a->call(op::tex_create, {}, {array_resource(arr_b), tex_desc(), {}}).result ==
          CUDA_ERROR_INVALID_HANDLE);
    CHECK(a->call(op::surf_create, {}, {array_resource(arr_b)}).result == CUDA_ERROR_INVALID_HANDLE);

    // Copies past A's array: wider, taller, deeper than it, or overflowing.
    CHECK(to_array(*a, arr_a, 0, 0, 0, row, h, 1).result == CUDA_SUCCESS);
    CHECK(to_array(*a, arr_a, 4, 0, 0, row, 1, 1).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(to_array(*a, arr_a, 0, h - 1, 0, 16, 2, 1).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(to_array(*a, arr_a, 0, 0, 1, 16, 1, 1).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(to_array(*a, arr_a, ~uint64_t{0} - 3, 0, 0, 16, 1, 1).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(from_array(*a, arr_a, row + 4, 1).result == CUDA_ERROR_INVALID_VALUE);

    // Texture and surface objects: B's are not A's to destroy or ask about.
    auto tb = b->call(op::tex_create, {}, {array_resource(arr_b), tex_desc(), {}});
    REQUIRE(tb.result == CUDA_SUCCESS);
    auto sb = b->call(op::surf_create, {}, {array_resource(arr_b)});
    REQUIRE(sb.result == CUDA_SUCCESS);
    uint64_t tex_b = tb.outs.at(0), surf_b = sb.outs.at(0);
    CHECK(a->call(op::tex_destroy, {tex_b}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::tex_resource_desc, {tex_b}).result == CUDA_ERROR_INVALID_VALUE);
    for (uint64_t which : {0, 1, 2})  // its resource, texture and view descriptors
        CHECK(a->call(op::tex_resource_desc, {tex_b, which}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::tex_resource_desc, {surf_b, 3}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(b->call(op::tex_resource_desc, {tex_b, 3}).result == CUDA_ERROR_INVALID_VALUE);   // no surface
    CHECK(b->call(op::tex_resource_desc, {surf_b, 1}).result == CUDA_ERROR_INVALID_VALUE);  // no texture
    CHECK(b->call(op::tex_resource_desc, {tex_b, 4}).result != CUDA_SUCCESS);  // no such descriptor
    CHECK(b->call(op::tex_resource_desc, {tex_b, 1}).result == CUDA_SUCCESS);
    CHECK(b->call(op::tex_resource_desc, {surf_b, 3}).result == CUDA_SUCCESS);
    CHECK(a->call(op::surf_destroy, {surf_b}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(b->call(op::tex_destroy, {surf_b}).result == CUDA_ERROR_INVALID_VALUE);  // a surface is no texture
    // A linear texture over B's memory is refused; one past A's own allocation is made (as the driver makes
    // it), cut at the allocation's end for the driver, and reads back as it was given.
    auto pb = b->call(op::mem_alloc, {4096});
    auto pa = a->call(op::mem_alloc, {4096});
    REQUIRE(pb.result == CUDA_SUCCESS);
    REQUIRE(pa.result == CUDA_SUCCESS);
    CHECK(a->call(op::tex_create, {}, {linear_resource(pb.outs.at(0), 4096), tex_desc(), {}}).result ==
          CUDA_ERROR_INVALID_VALUE);
    auto past = a->call(op::tex_create, {}, {linear_resource(pa.outs.at(0), 8192), tex_desc(), {}});
    REQUIRE(past.result == CUDA_SUCCESS);
    auto past_desc = a->call(op::tex_resource_desc, {past.outs.at(0)});
    REQUIRE(past_desc.result == CUDA_SUCCESS);
    REQUIRE(past_desc.blobs.size() == 1);
    CUDA_RESOURCE_DESC given{};
    REQUIRE(past_desc.blobs[0].size() == sizeof given);
    std::memcpy(&given, past_desc.blobs[0].data(), sizeof given);
    CHECK(given.res.linear.sizeInBytes == 8192);
    CHECK(a->call(op::tex_destroy, {past.outs.at(0)}).result == CUDA_SUCCESS);
    auto ta = a->call(op::tex_create, {}, {linear_resource(pa.outs.at(0), 4096), tex_desc(), {}});
    CHECK(ta.result == CUDA_SUCCESS);

    // B's objects and array still work, and go.
    CHECK(from_array(*b, arr_b, row, h).payload == data);
    CHECK(b->call(op::tex_resource_desc, {tex_b}).result == CUDA_SUCCESS);
    CHECK(b->call(op::tex_destroy, {tex_b}).result == CUDA_SUCCESS);
    CHECK(b->call(op::surf_destroy, {surf_b}).result == CUDA_SUCCESS);
    CHECK(b->call(op::tex_destroy, {tex_b}).result == CUDA_ERROR_INVALID_VALUE);  // gone
    CHECK(b->call(op::array_destroy, {arr_b}).result == CUDA_SUCCESS);
    CHECK(b->call(op::array_descriptor, {arr_b}).result == CUDA_ERROR_INVALID_HANDLE);  // stale
}

TEST_CASE("malformed array and resource descriptors are refused, and arrays count against the quota",
          "[integration]") {
    server_process server({"--memory-quota", "64MiB"});
    auto a = raw_client::open(server.address());
    REQUIRE(a);
    // Unknown format, 3 channels, no width, unknown or sparse flags, depth on a 2D create, wrong argument
    // count.
    CHECK(a->call(op::array_create, {16, 16, 0, 99, 1, 0, 1}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::array_create, {16, 16, 0, CU_AD_FORMAT_FLOAT, 3, 0, 1}).result ==
          CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::array_create, {0, 16, 0, CU_AD_FORMAT_FLOAT, 1, 0, 1}).result ==
          CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::array_create, {16, 16, 0, CU_AD_FORMAT_FLOAT, 1, CUDA_ARRAY3D_SPARSE, 1}).result ==
          CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::array_create, {16, 16, 4, CU_AD_FORMAT_FLOAT, 1, 0, 0}).result ==
          CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::array_create, {~uint64_t{0}, 16, 0, CU_AD_FORMAT_FLOAT, 1, 0, 1}).result ==
          CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::array_create, {16, 16, 0, CU_AD_FORMAT_FLOAT, 1}).result == CUDA_ERROR_INVALID_VALUE);
    // Resource descriptors: wrong sizes, flags, types; a surface over linear memory.
    auto arr = make_array(*a, 16, 16);
    REQUIRE(arr.result == CUDA_SUCCESS);
    auto res = array_resource(arr.outs.at(0));
    CHECK(a->call(op::tex_create, {}, {res}).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::tex_create, {}, {std::vector<std::byte>(res.begin(), res.end() - 1), tex_desc(), {}})
              .result == CUDA_ERROR_INVALID_VALUE);
    CUDA_RESOURCE_DESC bad{};
    std::memcpy(&bad, res.data(), sizeof bad);
    bad.flags = 1;
    CHECK(a->call(op::tex_create, {}, {bytes(bad), tex_desc(), {}}).result == CUDA_ERROR_INVALID_VALUE);
    bad.flags = 0;
    bad.resType = static_cast<CUresourcetype>(42);
    CHECK(a->call(op::tex_create, {}, {bytes(bad), tex_desc(), {}}).result == CUDA_ERROR_INVALID_VALUE);
    auto p = a->call(op::mem_alloc, {4096});
    REQUIRE(p.result == CUDA_SUCCESS);
    CHECK(a->call(op::surf_create, {}, {linear_resource(p.outs.at(0), 4096)}).result ==
          CUDA_ERROR_INVALID_VALUE);
    // A surface needs an array made for load/store (the driver says so).
    CHECK(a->call(op::surf_create, {}, {res}).result != CUDA_SUCCESS);

    // 128 MiB of array does not fit a 64 MiB quota; 32 MiB does, twice, and its destruction gives it back.
    CHECK(make_array(*a, 8192, 4096).result == CUDA_ERROR_OUT_OF_MEMORY);
    auto big = make_array(*a, 4096, 2048);
    REQUIRE(big.result == CUDA_SUCCESS);
    CHECK(make_array(*a, 4096, 2048).result == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(a->call(op::array_destroy, {big.outs.at(0)}).result == CUDA_SUCCESS);
    CHECK(make_array(*a, 4096, 2048).result == CUDA_SUCCESS);
    // The server still serves a new session.
    auto c = raw_client::open(server.address());
    REQUIRE(c);
    CHECK(make_array(*c, 16, 16).result == CUDA_SUCCESS);
}

TEST_CASE("a session's end destroys its arrays and objects and gives their memory back to the device",
          "[integration]") {
    // A 100 MiB software GPU: a second session's 64 MiB of arrays fit only if the first session's went back.
    setenv("VCUDA_SOFT_MEMORY", std::to_string(100u << 20).c_str(), 1);
    server_process server;
    unsetenv("VCUDA_SOFT_MEMORY");
    {
        auto a = raw_client::open(server.address());
        REQUIRE(a);
        auto arr = make_array(*a, 4096, 4096, CUDA_ARRAY3D_SURFACE_LDST);  // 64 MiB
        REQUIRE(arr.result == CUDA_SUCCESS);
        REQUIRE(a->call(op::tex_create, {}, {array_resource(arr.outs.at(0)), tex_desc(), {}}).result ==
                CUDA_SUCCESS);
        REQUIRE(a->call(op::surf_create, {}, {array_resource(arr.outs.at(0))}).result == CUDA_SUCCESS);
        CHECK(make_array(*a, 4096, 4096).result == CUDA_ERROR_OUT_OF_MEMORY);  // the device is full
    }  // closed without any cleanup call, as a crashed client would
    CHECK(server.wait_for_log("released 64 MiB"));
    auto b = raw_client::open(server.address());
    REQUIRE(b);
    CHECK(make_array(*b, 4096, 4096).result == CUDA_SUCCESS);
}

TEST_CASE(
    "a mipmapped array's levels are its own: destroyed only with it, another session's to no one, charged "
    "in full, and released with the session",
    "[integration]") {
    // A 100 MiB software GPU, a 64 MiB quota: a 4096 x 2048 float mipmapped array (32 MiB at level 0, about
    // 42.7 MiB with its levels) fits once, not twice.
    setenv("VCUDA_SOFT_MEMORY", std::to_string(100u << 20).c_str(), 1);
    server_process server({"--memory-quota", "64MiB"});
    unsetenv("VCUDA_SOFT_MEMORY");
    auto a = raw_client::open(server.address());
    auto b = raw_client::open(server.address());
    REQUIRE(a);
    REQUIRE(b);
    auto mipmapped = [](raw_client& c, uint64_t w, uint64_t h, uint64_t levels) {
        return c.call(op::mipmapped_array_create, {w, h, 0, CU_AD_FORMAT_FLOAT, 1, 0, levels});
    };
    // More levels than halvings of the largest extent, none, and a wrong argument count.
    CHECK(mipmapped(*a, 64, 32, 8).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(mipmapped(*a, 64, 32, 0).result == CUDA_ERROR_INVALID_VALUE);
    CHECK(a->call(op::mipmapped_array_create, {64, 32, 0, CU_AD_FORMAT_FLOAT, 1, 0}).result ==
          CUDA_ERROR_INVALID_VALUE);

    auto m = mipmapped(*a, 64, 32, 7);
    REQUIRE(m.result == CUDA_SUCCESS);
    REQUIRE(m.outs.size() == 8);
    const uint64_t mm = m.outs[0], level3 = m.outs[4];
    auto d = a->call(op::array_descriptor, {level3});
    REQUIRE(d.result == CUDA_SUCCESS);
    CHECK((d.outs.at(0) == 8 && d.outs.at(1) == 4));
    CHECK(a->call(op::mipmapped_array_create, {1, 1, 0, CU_AD_FORMAT_FLOAT, 1, 0, 1}).result == CUDA_SUCCESS);
    // A level is copied to within its own extent, and never destroyed on its own.
    CHECK(to_array(*a, level3, 0, 0, 0, 32, 4, 1).result == CUDA_SUCCESS);
    CHECK(to_array(*a, level3, 0, 0, 0, 33, 4, 1).result == CUDA_ERROR_INVALID_VALUE);
    auto refused = a->call(op::array_destroy, {level3});
    CHECK(refused.result == CUDA_ERROR_INVALID_VALUE);
    CHECK(refused.detail.find("mipmapped") != std::string::npos);

    // Session B can use neither the mipmapped array nor its levels.
    CUDA_RESOURCE_DESC r{};
    r.resType = CU_RESOURCE_TYPE_MIPMAPPED_ARRAY;
    r.res.mipmap.hMipmappedArray = reinterpret_cast<CUmipmappedArray>(mm);
    CHECK(b->call(op::tex_create, {}, {bytes(r), tex_desc(), {}}).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(b->call(op::mipmapped_array_destroy, {mm}).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(b->call(op::array_destroy, {level3}).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(from_array(*b, level3, 32, 4).result == CUDA_ERROR_INVALID_HANDLE);
    // A's texture over it works; a surface over a mipmapped array is refused.
    auto tex = a->call(op::tex_create, {}, {bytes(r), tex_desc(), {}});
    CHECK(tex.result == CUDA_SUCCESS);
    CHECK(a->call(op::surf_create, {}, {bytes(r)}).result == CUDA_ERROR_INVALID_VALUE);

    // The quota counts every level; destroying the mipmapped array gives all of it back and ends its levels.
    auto big = mipmapped(*a, 4096, 2048, 12);
    REQUIRE(big.result == CUDA_SUCCESS);
    CHECK(mipmapped(*a, 4096, 2048, 12).result == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(make_array(*a, 4096, 2048).result == CUDA_ERROR_OUT_OF_MEMORY);  // 32 MiB more: past the quota
    CHECK(a->call(op::mipmapped_array_destroy, {big.outs.at(0)}).result == CUDA_SUCCESS);
    CHECK(a->call(op::array_descriptor, {big.outs.at(1)}).result == CUDA_ERROR_INVALID_HANDLE);
    CHECK(a->call(op::mipmapped_array_destroy, {big.outs.at(0)}).result == CUDA_ERROR_INVALID_HANDLE);
    big = mipmapped(*a, 4096, 2048, 12);
    REQUIRE(big.result == CUDA_SUCCESS);

    // A session that ends without a cleanup call gives it all back to the device.
    a.reset();
    INFO(server.log());
    CHECK(server.wait_for_log("released 42 MiB"));
    CHECK(mipmapped(*b, 4096, 2048, 12).result == CUDA_SUCCESS);
}
