// Where a session that moved here runs: its device indices are the client's (kept from the server it came
// from, since the client names its devices by them in every call), each placed on one of this server's GPUs,
// whose index may differ (session_grant::placed, server/session.hpp). Header-only: the unit tests use it
// alone.
#pragma once

#include <algorithm>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

namespace vcuda::server {

// The most device indices a moved session may bring (a slot is made for each index below its highest).
inline constexpr size_t max_moved_devices = 64;

// Places a moved session's device indices (`indices`) on this server's GPUs: each on the GPU of the same
// index when the grant allows every one of them there (`granted`: the GPUs a lease token or HELLO names here;
// empty = all `gpu_count`), else in order on the granted GPUs, so that a session of GPU 1 of one server may
// run on GPU 0 of another. False, with `why` and `placed` unchanged, when it uses more GPUs than it may have
// here.
inline bool place_moved(std::vector<size_t> indices, std::vector<size_t> granted, size_t gpu_count,
                        std::map<size_t, size_t>& placed, std::string& why) {
    if (granted.empty())
        for (size_t g = 0; g < gpu_count; ++g) granted.push_back(g);
    std::sort(granted.begin(), granted.end());
    granted.erase(std::unique(granted.begin(), granted.end()), granted.end());
    std::sort(indices.begin(), indices.end());
    indices.erase(std::unique(indices.begin(), indices.end()), indices.end());
    if (!indices.empty() && indices.back() >= max_moved_devices) {
        why = "it names device index " + std::to_string(indices.back()) + " (at most " +
              std::to_string(max_moved_devices - 1) + ")";
        return false;
    }
    if (indices.size() > granted.size() || (!granted.empty() && granted.back() >= gpu_count)) {
        why = "it uses " + std::to_string(indices.size()) + " GPU(s); it may have " +
              std::to_string(std::min(granted.size(), gpu_count)) + " here";
        return false;
    }
    const bool same = std::all_of(indices.begin(), indices.end(), [&](size_t i) {
        return std::binary_search(granted.begin(), granted.end(), i);
    });
    placed.clear();
    for (size_t k = 0; k < indices.size(); ++k) placed[indices[k]] = same ? indices[k] : granted[k];
    return true;
}

}  // namespace vcuda::server
