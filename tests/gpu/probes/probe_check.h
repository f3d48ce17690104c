// What the probes of this folder share: CHECK(call) prints a driver call that failed and its error's name,
// and the probe goes on (a probe reports what the driver answers; it does not stop at the first refusal).
#pragma once

#include <cuda.h>

#include <cstdio>

#define CHECK(x)                                          \
    do {                                                  \
        CUresult r_ = (x);                                \
        if (r_ != CUDA_SUCCESS) {                         \
            const char* s_ = nullptr;                     \
            cuGetErrorName(r_, &s_);                      \
            std::printf("%s -> %s\n", #x, s_ ? s_ : "?"); \
        }                                                 \
    } while (0)
