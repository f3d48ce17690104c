// The caller's JIT options, rebuilt for the real driver: values as sent, log buffers of the server's own
// (sized as the caller's), answered back as each value word after the call plus the two logs. Kept alive as
// long as the driver may write into it (a link state writes its logs at cuLinkComplete).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "common/jit_options.hpp"
#include "driver_table.hpp"

namespace vcuda::server {

class call_context;

struct jit_request {
    std::vector<CUjit_option> options;
    std::vector<void*> values;
    std::vector<char> info_log, error_log;

    // Parses blob bytes (see common/jit_options.hpp). On failure `why` says which option and the request is
    // empty.
    CUresult parse(std::span<const std::byte> blob, std::string& why);
    unsigned count() const { return static_cast<unsigned>(options.size()); }
    CUjit_option* option_array() { return options.empty() ? nullptr : options.data(); }
    void** value_array() { return values.empty() ? nullptr : values.data(); }
    // Appends each value word to the reply's outs (0 for log buffers) and the logs as two blobs.
    void answer(call_context& cx) const;
};

// Loads an image the client sent (its parts, each 8-byte aligned) as a module (`library` false) or a library:
// `format` 0 is a bare image, 1 and 2 a fatbin wrapper of that version (2: the other parts are its linked
// fatbins). Used at load time and when a suspended session is rebuilt.
CUresult load_image(const driver_table& d, bool library, uint64_t format,
                    const std::vector<std::vector<uint64_t>>& parts, jit_request& jit, void*& out);

}  // namespace vcuda::server
