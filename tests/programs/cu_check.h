// CU_CHECK for the driver-API test programs (no runtime): a failing call ends the program with its error
// name.
#pragma once

#include <cuda.h>

#include "common.cuh"

#define CU_CHECK(call)                                                                         \
    do {                                                                                       \
        CUresult r_ = (call);                                                                  \
        if (r_ != CUDA_SUCCESS) {                                                              \
            const char* n_ = "?";                                                              \
            cuGetErrorName(r_, &n_);                                                           \
            fail("%s returned %s (%d) at line %d", #call, n_, static_cast<int>(r_), __LINE__); \
        }                                                                                      \
    } while (0)

// The start of a driver-API program: cuInit, device 0, its primary context retained and made current.
static inline CUdevice init_device0(CUcontext* ctx) {
    CU_CHECK(cuInit(0));
    CUdevice dev;
    CU_CHECK(cuDeviceGet(&dev, 0));
    CU_CHECK(cuDevicePrimaryCtxRetain(ctx, dev));
    CU_CHECK(cuCtxSetCurrent(*ctx));
    return dev;
}
