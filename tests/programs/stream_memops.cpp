// stream_memops: cuStreamWriteValue32/64 and cuStreamWaitValue32/64 on device memory, in stream order with
// copies: words written, waits whose condition an earlier write met (each comparison), a wait in one stream
// on a word another stream wrote (ordered by an event), and flags and alignments the driver refuses. Linked
// with -lcuda, no runtime.
#include <cuda.h>

#include <cstring>
#include <vector>

#include "common.cuh"
#include "cu_check.h"

int main() {
    CUcontext ctx;
    CUdevice dev = init_device0(&ctx);
    int can_wait = 0, can_64 = 0;
    CU_CHECK(cuDeviceGetAttribute(&can_wait, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR, dev));
    CU_CHECK(cuDeviceGetAttribute(&can_64, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS, dev));
    std::printf("wait NOR %d, 64-bit memops %d\n", can_wait, can_64);

    CUstream s, t;
    CU_CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CU_CHECK(cuStreamCreate(&t, CU_STREAM_NON_BLOCKING));
    CUdeviceptr words;
    CU_CHECK(cuMemAlloc(&words, 256));
    CU_CHECK(cuMemsetD8Async(words, 0, 256, s));

    CU_CHECK(cuStreamWriteValue32(s, words, 7, 0));
    CU_CHECK(cuStreamWriteValue32(s, words + 4, 0xf0, 0));
    CU_CHECK(cuStreamWriteValue64(s, words + 8, 0x1122334455667788ull, 0));
    CU_CHECK(cuStreamWaitValue32(s, words, 7, CU_STREAM_WAIT_VALUE_EQ));
    CU_CHECK(cuStreamWaitValue32(s, words, 5, CU_STREAM_WAIT_VALUE_GEQ));
    CU_CHECK(cuStreamWaitValue32(s, words + 4, 0x10, CU_STREAM_WAIT_VALUE_AND));
    CU_CHECK(cuStreamWaitValue64(s, words + 8, 0x1122334455667788ull, CU_STREAM_WAIT_VALUE_EQ));
    CU_CHECK(cuStreamWriteValue32(s, words + 16, 99, 0));  // after the waits: written only once they passed
    uint32_t h32[5] = {};
    uint64_t h64 = 0;
    CU_CHECK(cuMemcpyDtoHAsync(h32, words, sizeof h32, s));
    CU_CHECK(cuMemcpyDtoHAsync(&h64, words + 8, 8, s));
    CU_CHECK(cuStreamSynchronize(s));
    std::printf("words: %u 0x%x 0x%llx %u\n", h32[0], h32[1], static_cast<unsigned long long>(h64), h32[4]);
    EXPECT(h32[0] == 7 && h32[1] == 0xf0 && h64 == 0x1122334455667788ull && h32[4] == 99,
           "stream memory operations wrote wrong values");

    // Across streams: t waits for s's event, then for the word s wrote, then writes its own.
    CUevent e;
    CU_CHECK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    CU_CHECK(cuStreamWriteValue32(s, words + 32, 1, 0));
    CU_CHECK(cuEventRecord(e, s));
    CU_CHECK(cuStreamWaitEvent(t, e, 0));
    CU_CHECK(cuStreamWaitValue32(t, words + 32, 1, CU_STREAM_WAIT_VALUE_EQ));
    CU_CHECK(cuStreamWriteValue32(t, words + 36, 42, 0));
    CU_CHECK(cuStreamSynchronize(t));
    uint32_t released = 0;
    CU_CHECK(cuMemcpyDtoH(&released, words + 36, 4));
    std::printf("wait after the other stream's write: %u\n", released);
    EXPECT(released == 42, "the write behind the wait gave %u", released);
    CU_CHECK(cuEventDestroy(e));

    // A batch (cuStreamBatchMemOp): two writes, a wait on the first, a barrier, then a write behind them.
    CUstreamBatchMemOpParams ops[5] = {};
    ops[0].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    ops[0].writeValue.address = words + 40;
    ops[0].writeValue.value = 5;
    ops[1].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_64;
    ops[1].writeValue.address = words + 48;
    ops[1].writeValue.value64 = 0x0102030405060708ull;
    ops[2].waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    ops[2].waitValue.address = words + 40;
    ops[2].waitValue.value = 5;
    ops[2].waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
    ops[3].memoryBarrier.operation = CU_STREAM_MEM_OP_BARRIER;
    ops[3].memoryBarrier.flags = CU_STREAM_MEMORY_BARRIER_TYPE_GPU;
    ops[4].writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    ops[4].writeValue.address = words + 56;
    ops[4].writeValue.value = 6;
    CU_CHECK(cuStreamBatchMemOp(s, 5, ops, 0));
    uint32_t b32[2] = {};
    uint64_t b64 = 0;
    CU_CHECK(cuMemcpyDtoHAsync(&b32[0], words + 40, 4, s));
    CU_CHECK(cuMemcpyDtoHAsync(&b64, words + 48, 8, s));
    CU_CHECK(cuMemcpyDtoHAsync(&b32[1], words + 56, 4, s));
    CU_CHECK(cuStreamSynchronize(s));
    std::printf("batch: %u 0x%llx %u\n", b32[0], static_cast<unsigned long long>(b64), b32[1]);
    EXPECT(b32[0] == 5 && b64 == 0x0102030405060708ull && b32[1] == 6, "the batch wrote wrong values");

    // Refusals at the call.
    std::printf("unknown wait flag: %d\n", static_cast<int>(cuStreamWaitValue32(s, words, 1, 7)));
    std::printf("unknown write flag: %d\n", static_cast<int>(cuStreamWriteValue32(s, words, 1, 4)));
    // The _v2 entry points (what cuda.h names since CUDA 12) refuse this flag.
    std::printf("no-memory-barrier write: %d\n",
                static_cast<int>(cuStreamWriteValue32(s, words, 1, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER)));
    std::printf("misaligned 64-bit write: %d\n", static_cast<int>(cuStreamWriteValue64(s, words + 4, 1, 0)));
    CU_CHECK(cuStreamSynchronize(s));

    CU_CHECK(cuMemFree(words));
    CU_CHECK(cuStreamDestroy(s));
    CU_CHECK(cuStreamDestroy(t));
    CU_CHECK(cuDevicePrimaryCtxRelease(dev));
    return pass();
}
