// The caller's JIT options on their way to the server and back (the wire form: common/jit_options.hpp).
#pragma once

#include "client/state.hpp"  // first: it sets up cuda.h as the client needs it

#include <cstdint>
#include <span>
#include <vector>

namespace vcuda::client {

struct jit_call {
    unsigned count = 0;
    CUjit_option* options = nullptr;
    void** values = nullptr;
    std::vector<uint64_t> words;  // (option, value) pairs as sent

    // Takes the caller's options; CUDA_ERROR_NOT_SUPPORTED (the option named in the log) for one vcuda cannot
    // carry, CUDA_ERROR_INVALID_VALUE for missing arrays.
    CUresult take(unsigned n, CUjit_option* o, void** v, const char* caller);
    std::span<const std::byte> blob() const {
        return {reinterpret_cast<const std::byte*>(words.data()), words.size() * 8};
    }
    // Writes the server's answer into the caller's options: the value words from outs[first...] and the logs
    // from the reply's first two blobs. False when the reply does not have that shape.
    bool answer(const call_reply& rp, size_t first) const;
};

}  // namespace vcuda::client
