// nccl_allreduce: NCCL through vcuda, one process, one GPU — a communicator of one rank (ncclCommInitAll),
// an out-of-place float sum all-reduce, then a group of two in-place all-reduces (float sum, int32 max) on a
// created stream, each checked (with one rank the result is the input). GPU only (the software driver of CI
// cannot run NCCL kernels). Built with -lnccl (dynamic); at run time libnccl.so.2 comes from LD_LIBRARY_PATH.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <vector>

#include "common.cuh"

#define CHECK_NCCL(call)                                                                              \
    do {                                                                                              \
        ncclResult_t r_ = (call);                                                                     \
        if (r_ != ncclSuccess)                                                                        \
            fail("%s returned %d (%s) at line %d", #call, int(r_), ncclGetErrorString(r_), __LINE__); \
    } while (0)

int main() {
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    EXPECT(count > 0, "no device");
    int version = 0;
    CHECK_NCCL(ncclGetVersion(&version));
    printf("info: nccl version %d (built against %d.%d.%d)\n", version, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);

    CHECK(cudaSetDevice(0));
    ncclComm_t comm;
    const int devlist[1] = {0};
    CHECK_NCCL(ncclCommInitAll(&comm, 1, devlist));
    int nranks = -1, rank = -1, dev = -1;
    CHECK_NCCL(ncclCommCount(comm, &nranks));
    CHECK_NCCL(ncclCommUserRank(comm, &rank));
    CHECK_NCCL(ncclCommCuDevice(comm, &dev));
    printf("communicator: %d rank(s), rank %d on device %d\n", nranks, rank, dev);
    EXPECT(nranks == 1 && rank == 0 && dev == 0, "unexpected communicator: %d ranks, rank %d, device %d",
           nranks, rank, dev);

    cudaStream_t stream;
    CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    // Not a multiple of any chunk size NCCL might use.
    const size_t n = (size_t(1) << 20) + 37;
    rng g(0x4cc1);
    std::vector<float> in(n), out(n, -1.0f);
    std::vector<int32_t> ints(n), ints_out(n, -1);
    for (size_t i = 0; i < n; ++i) {
        in[i] =
            static_cast<float>(static_cast<int>(g.u32() % 2001) - 1000) / 8.0f;  // exact: multiples of 1/8
        ints[i] = static_cast<int32_t>(g.u32());
    }

    float *d_send, *d_recv;
    int32_t* d_ints;
    CHECK(cudaMalloc(&d_send, n * sizeof(float)));
    CHECK(cudaMalloc(&d_recv, n * sizeof(float)));
    CHECK(cudaMalloc(&d_ints, n * sizeof(int32_t)));
    CHECK(cudaMemcpyAsync(d_send, in.data(), n * sizeof(float), cudaMemcpyHostToDevice, stream));
    CHECK(cudaMemcpyAsync(d_ints, ints.data(), n * sizeof(int32_t), cudaMemcpyHostToDevice, stream));
    CHECK(cudaMemsetAsync(d_recv, 0xff, n * sizeof(float), stream));

    // --- out of place: recv = sum over the one rank of send
    CHECK_NCCL(ncclAllReduce(d_send, d_recv, n, ncclFloat, ncclSum, comm, stream));
    CHECK(cudaMemcpyAsync(out.data(), d_recv, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    double sum = 0;
    for (size_t i = 0; i < n; ++i) {
        if (out[i] != in[i]) fail("out-of-place sum: recv[%zu] = %.9g, expected %.9g", i, out[i], in[i]);
        sum += out[i];
    }
    printf(
        "allreduce float sum out of place, n = %zu: ok, checksum = %.3f, recv[0] = %.3f, recv[n-1] = %.3f\n",
        n, sum, out[0], out[n - 1]);

    // --- in place, two operations in one group
    CHECK_NCCL(ncclGroupStart());
    CHECK_NCCL(ncclAllReduce(d_recv, d_recv, n, ncclFloat, ncclSum, comm, stream));
    CHECK_NCCL(ncclAllReduce(d_ints, d_ints, n, ncclInt32, ncclMax, comm, stream));
    CHECK_NCCL(ncclGroupEnd());
    std::fill(out.begin(), out.end(), -1.0f);
    CHECK(cudaMemcpyAsync(out.data(), d_recv, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaMemcpyAsync(ints_out.data(), d_ints, n * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));
    sum = 0;
    for (size_t i = 0; i < n; ++i) {
        if (out[i] != in[i]) fail("in-place sum: buf[%zu] = %.9g, expected %.9g", i, out[i], in[i]);
        sum += out[i];
    }
    uint64_t digest = fnv1a(ints_out.data(), n * sizeof(int32_t));
    for (size_t i = 0; i < n; ++i)
        if (ints_out[i] != ints[i]) fail("in-place max: buf[%zu] = %d, expected %d", i, ints_out[i], ints[i]);
    printf("grouped in place: float sum ok, checksum = %.3f; int32 max ok, digest = %016llx\n", sum,
           static_cast<unsigned long long>(digest));

    CHECK_NCCL(ncclCommFinalize(comm));
    CHECK_NCCL(ncclCommDestroy(comm));
    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(d_send));
    CHECK(cudaFree(d_recv));
    CHECK(cudaFree(d_ints));
    return pass();
}
