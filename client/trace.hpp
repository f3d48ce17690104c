// The record mode (client/TRACE.md). With VCUDA_TRACE set, libcuda.so.1 talks to no server: every exported
// driver function forwards to the real driver (dlopened from VCUDA_TRACE_DRIVER or the system's usual
// places) and writes one line per call. Each exported function begins with VCUDA_TRACE_HOOK, which hands the
// call to its generated twin in vcuda::client::trace (client_trace.cpp, tools/gen_driver_api.py); the
// check is one load of a global flag set once by a library constructor.
#pragma once

#include <cstdint>

#include "client_trace.hpp"  // generated: the trace functions, one per exported symbol

namespace vcuda::client::trace {

// Set once, before any other code of the library runs, from VCUDA_TRACE.
extern bool enabled;
inline bool active() { return __builtin_expect(enabled, false); }

// The real driver's entry point for exported symbol `index` (client_trace.hpp's numbering); the first call
// loads the real driver. Null when the driver lacks the symbol or could not be loaded.
void* real_fn(int index);
class call;
// What a trace function answers when real_fn gave null (no real driver, or one without that symbol); the
// reason goes at the end of the call's line.
int missing(call& c);
// True when `p` lies in the real driver's code (export-table words that are entry points).
bool in_real_driver_code(const void* p);

}  // namespace vcuda::client::trace

// First statement of every exported driver function: in record mode the call goes to the real driver, traced.
#define VCUDA_TRACE_HOOK(fn, ...)                                                             \
    do {                                                                                      \
        if (::vcuda::client::trace::active()) return ::vcuda::client::trace::fn(__VA_ARGS__); \
    } while (0)
