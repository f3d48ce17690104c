// The CUresult codes cuda.h names, with their names and descriptions (generated from cuda.h into
// error_names.inc by tools/gen_driver_api.py): cuGetErrorName/cuGetErrorString and the record mode's result
// names read this one table. Header only, needing nothing but the generated file.
#pragma once

namespace vcuda::client {

struct error_name {
    int code;
    const char* name;
    const char* text;
};

inline constexpr error_name error_names[] = {
#include "error_names.inc"
};

// The entry of `code`, or null for a code cuda.h does not name.
constexpr const error_name* find_error_name(int code) {
    for (auto& n : error_names)
        if (n.code == code) return &n;
    return nullptr;
}

}  // namespace vcuda::client
