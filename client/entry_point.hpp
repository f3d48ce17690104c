// VCUDA_API declares a hand-written driver entry point (client/api_*.cpp): C linkage, default visibility
// (everything else in libcuda.so.1 is hidden, and the generated version script keeps exactly the real
// driver's symbols) and the CUresult it returns. Definitions add `noexcept`: VCUDA_API cuInit(unsigned int)
// noexcept {...}.
#pragma once

#define VCUDA_API extern "C" __attribute__((visibility("default"))) CUresult
