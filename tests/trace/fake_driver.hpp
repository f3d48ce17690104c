// The record-mode tests' fake driver (libvcuda-trace-fakedriver.so): every libcuda symbol, each recording its
// name and answering 999, plus export tables with known slots. A test stand-in, never shipped.
#pragma once

#include <cstdint>

extern "C" {
// The last entry point called and how many calls there were (read by the tests through dlsym).
__attribute__((visibility("default"))) extern const char* fake_last_call;
__attribute__((visibility("default"))) extern int fake_call_count;
}

int fake_record(const char* name);
