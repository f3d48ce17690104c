// Record mode, private export tables (client/TRACE.md): the table cuGetExportTable hands back in trace mode
// is a copy of the real driver's in which every entry point is replaced by a logging shim that forwards to
// the real slot. Depends only on client/trace_log.hpp, so that tests can link it without the rest of the
// client.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace vcuda::client::trace {

// Whether a table word is an entry point (lies in the real driver's code). Words that are not are copied as
// they are. The library sets in_real_driver_code; tests set their own.
using code_predicate = bool (*)(const void*);

// The table to hand to the caller for `id` (16 bytes), given the real driver's table `real`: the same copy
// for the same id every time (tables stay at one address for the life of the process), or `real` itself for
// the tables that must not be copied — the integrity check (d4082055) and the cudart interface (6bd5fb6c),
// whose addresses the integrity digest covers. `note` says what was done, for the cuGetExportTable line.
const void* wrap_export_table(const unsigned char* id, const void* real, code_predicate is_code,
                              std::string& note);

// How many leading arguments of a slot call are dumped (the 4 words they point to after the call) when they
// look like pointers: VCUDA_TRACE_DEREF, 0..6, default 6.
extern int deref_args;
// How many 8-byte words of each are shown: VCUDA_TRACE_WORDS, 1..64, default 4. Words the call changed are
// followed by their value before the call: `0x1<-0x0`.
extern int deref_words;

}  // namespace vcuda::client::trace
