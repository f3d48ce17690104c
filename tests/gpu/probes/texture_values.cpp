// A probe of the real driver, run natively (no vcuda): how does the driver choose the values of texture and
// surface objects? Kernels receive them by value, so a suspend or a move can keep them valid only if a new
// context gives the same values when the objects are made again (server/array_image.cpp).
// Two contexts in one process, each: four texture objects, two surface objects, the second texture and the
// first surface destroyed, then a linear texture, a surface and a texture; the values printed in order of
// creation. Twice (contexts destroyed in between), in each of two processes.
//   nvcc -o texture_values texture_values.cpp -lcuda
// On the H200 (driver 580.159), every line of both runs printed
//   roundN ctxM: 1 2 3 4 5 6 7 8 9
// so values count from 1 in each context, texture and surface objects together, and a destroyed value is not
// given again (7 after 6, not 2).
#include <cuda.h>
#include <cstdio>
#include <vector>
#define CK(x)                             \
    do {                                  \
        CUresult r_ = (x);                \
        if (r_) {                         \
            printf("%s -> %d\n", #x, r_); \
            return 1;                     \
        }                                 \
    } while (0)
static int seq(const char* tag, CUcontext ctx, CUarray arr, CUdeviceptr lin) {
    CK(cuCtxSetCurrent(ctx));
    CUDA_RESOURCE_DESC rd{};
    rd.resType = CU_RESOURCE_TYPE_ARRAY;
    rd.res.array.hArray = arr;
    CUDA_TEXTURE_DESC td{};
    td.filterMode = CU_TR_FILTER_MODE_POINT;
    CUDA_RESOURCE_DESC rl{};
    rl.resType = CU_RESOURCE_TYPE_LINEAR;
    rl.res.linear.devPtr = lin;
    rl.res.linear.format = CU_AD_FORMAT_FLOAT;
    rl.res.linear.numChannels = 1;
    rl.res.linear.sizeInBytes = 4096;
    std::vector<unsigned long long> v;
    CUtexObject t[4];
    CUsurfObject s[2];
    for (auto& x : t) {
        CK(cuTexObjectCreate(&x, &rd, &td, nullptr));
        v.push_back(x);
    }
    for (auto& x : s) {
        CK(cuSurfObjectCreate(&x, &rd));
        v.push_back(x);
    }
    CK(cuTexObjectDestroy(t[1]));
    CK(cuSurfObjectDestroy(s[0]));
    CUtexObject t2, t3;
    CUsurfObject s2;
    CK(cuTexObjectCreate(&t2, &rl, &td, nullptr));
    v.push_back(t2);
    CK(cuSurfObjectCreate(&s2, &rd));
    v.push_back(s2);
    CK(cuTexObjectCreate(&t3, &rd, &td, nullptr));
    v.push_back(t3);
    printf("%s:", tag);
    for (auto x : v) printf(" %llx", x);
    printf("\n");
    return 0;
}
int main() {
    CK(cuInit(0));
    CUdevice d;
    CK(cuDeviceGet(&d, 0));
    CUctxCreateParams p{};
    for (int round = 0; round < 2; ++round) {
        CUcontext c1, c2;
        CK(cuCtxCreate(&c1, &p, 0, d));
        CUDA_ARRAY3D_DESCRIPTOR ad{};
        ad.Width = 64;
        ad.Height = 64;
        ad.Format = CU_AD_FORMAT_FLOAT;
        ad.NumChannels = 1;
        ad.Flags = CUDA_ARRAY3D_SURFACE_LDST;
        CUarray a1;
        CK(cuArray3DCreate(&a1, &ad));
        CUdeviceptr l1;
        CK(cuMemAlloc(&l1, 4096));
        CK(cuCtxCreate(&c2, &p, 0, d));
        CUarray a2;
        CK(cuArray3DCreate(&a2, &ad));
        CUdeviceptr l2;
        CK(cuMemAlloc(&l2, 4096));
        char tag[32];
        snprintf(tag, sizeof tag, "round%d ctx1", round);
        if (seq(tag, c1, a1, l1)) return 1;
        snprintf(tag, sizeof tag, "round%d ctx2", round);
        if (seq(tag, c2, a2, l2)) return 1;
        CK(cuCtxDestroy(c1));
        CK(cuCtxDestroy(c2));
    }
    return 0;
}
