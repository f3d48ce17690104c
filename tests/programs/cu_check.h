// CU_CHECK for the driver-API test programs (no runtime): a failing call ends the program with its error name.
#pragma once

#include <cuda.h>

#include "common.cuh"

#define CU_CHECK(call)                                                                                     \
    do {                                                                                                   \
        CUresult r_ = (call);                                                                              \
        if (r_ != CUDA_SUCCESS) {                                                                          \
            const char* n_ = "?";                                                                          \
            cuGetErrorName(r_, &n_);                                                                       \
            fail("%s returned %s (%d) at line %d", #call, n_, static_cast<int>(r_), __LINE__);              \
        }                                                                                                  \
    } while (0)
