// managed_globals: __managed__ variables, which cudart looks up (cuLibraryGetManaged) when it loads the
// module and the host code then reaches through that address. Their initial values read by the CPU before any
// kernel; CPU writes seen by a kernel that names the variables in its own code; its writes seen by the CPU
// after a synchronize, round after round, with one element written by the CPU between rounds; an array of
// 64 KiB over several pages beside small variables that may share a page with it; cudaMemcpyToSymbol /
// FromSymbol, cudaGetSymbolAddress and cudaMemset on them; a kernel given a variable's address as a
// parameter. `managed_globals ROUNDS PAUSE_MS`: a pause before each round, in which the session may be
// suspended or moved (its module loaded again, the variables maybe elsewhere): the CPU's view and the kernels
// must still agree.
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdlib>

#include "common.cuh"

constexpr int table_len = 16384;

struct bias_t {
    int add;
    int calls;
};

__managed__ int mg_counter = 5;
__managed__ bias_t mg_bias = {3, 0};
__managed__ int mg_table[table_len];
__managed__ unsigned long long mg_total;

// Names the variables itself: thread 0 counts the call, every thread moves one element.
extern "C" __global__ void mg_step(int round, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) mg_table[i] += mg_bias.add * round;
    if (i == 0) {
        mg_counter += round;
        mg_bias.calls += 1;
    }
}

// Through parameters: the sum of p[0..n) into *out (one thread).
extern "C" __global__ void mg_sum(const int* p, int n, unsigned long long* out) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    unsigned long long s = 0;
    for (int i = 0; i < n; ++i) s += static_cast<unsigned long long>(p[i]);
    *out = s;
}

int main(int argc, char** argv) {
    const int rounds = argc > 1 ? atoi(argv[1]) : 4;
    const int pause_ms = argc > 2 ? atoi(argv[2]) : 0;
    if (rounds < 1 || rounds > 1000 || pause_ms < 0) fail("usage: managed_globals [ROUNDS [PAUSE_MS]]");

    // Read by the CPU before any kernel or copy: the values the image gave them.
    printf("initial values: counter %d, bias %d/%d, table[0] %d, total %llu\n", mg_counter, mg_bias.add,
           mg_bias.calls, mg_table[0], mg_total);
    void* addr = nullptr;
    CHECK(cudaGetSymbolAddress(&addr, mg_counter));
    EXPECT(addr == static_cast<void*>(&mg_counter), "cudaGetSymbolAddress(mg_counter) %p, the host uses %p",
           addr, static_cast<void*>(&mg_counter));
    size_t size = 0;
    CHECK(cudaGetSymbolSize(&size, mg_table));
    EXPECT(size == sizeof mg_table, "cudaGetSymbolSize(mg_table) = %zu", size);
    cudaPointerAttributes attrs{};
    CHECK(cudaPointerGetAttributes(&attrs, mg_table));
    printf("mg_table's pointer attributes: type %d (managed %d)\n", static_cast<int>(attrs.type),
           static_cast<int>(cudaMemoryTypeManaged));

    // The CPU writes every variable, the kernels read and write them.
    mg_counter = 100;
    mg_bias = {7, 0};
    for (int i = 0; i < table_len; ++i) mg_table[i] = i;
    long long expect_counter = 100, added = 0;
    int bumped = -1;  // the element the CPU bumped between rounds (by 1000)
    for (int r = 1; r <= rounds; ++r) {
        if (pause_ms > 0) usleep(static_cast<useconds_t>(pause_ms) * 1000);
        mg_step<<<(table_len + 255) / 256, 256>>>(r, table_len);
        CHECK_LAUNCH();
        CHECK(cudaDeviceSynchronize());
        expect_counter += r;
        added += 7LL * r;
        EXPECT(mg_counter == expect_counter, "round %d: counter %d, expected %lld", r, mg_counter,
               expect_counter);
        EXPECT(mg_bias.calls == r, "round %d: %d calls counted", r, mg_bias.calls);
        for (int i = 0; i < table_len; ++i) {
            const long long want = i + added + (i <= bumped && i % 97 == 0 ? 1000 : 0);
            if (mg_table[i] != want) fail("round %d: table[%d] = %d, expected %lld", r, i, mg_table[i], want);
        }
        // One element in every 97 up to here, for the next round's kernel to find.
        for (int i = bumped + 1; i <= r * table_len / rounds - 1; ++i)
            if (i % 97 == 0) mg_table[i] += 1000;
        bumped = r * table_len / rounds - 1;
    }
    printf("%d rounds: counter %d, calls %d, table[97] %d, table[last] %d\n", rounds, mg_counter,
           mg_bias.calls, mg_table[97], mg_table[table_len - 1]);

    // A kernel given the variables' addresses.
    long long sum = 0;
    for (int i = 0; i < table_len; ++i) sum += mg_table[i];
    mg_sum<<<1, 1>>>(mg_table, table_len, &mg_total);
    CHECK_LAUNCH();
    CHECK(cudaDeviceSynchronize());
    EXPECT(mg_total == static_cast<unsigned long long>(sum), "mg_sum gave %llu, the CPU %lld", mg_total, sum);

    // The symbol API on them, then the CPU reads what it wrote.
    const int v = 42;
    CHECK(cudaMemcpyToSymbol(mg_counter, &v, sizeof v));
    EXPECT(mg_counter == 42, "after cudaMemcpyToSymbol the CPU reads %d", mg_counter);
    int fifth = 0;
    CHECK(cudaMemcpyFromSymbol(&fifth, mg_table, sizeof fifth, 5 * sizeof(int)));
    EXPECT(fifth == mg_table[5], "cudaMemcpyFromSymbol(table[5]) %d, the CPU reads %d", fifth, mg_table[5]);
    mg_table[6] = -6;  // written by the CPU, then read by a copy
    int sixth = 0;
    CHECK(cudaMemcpy(&sixth, &mg_table[6], sizeof sixth, cudaMemcpyDefault));
    EXPECT(sixth == -6, "a copy from table[6] after the CPU wrote it gave %d", sixth);
    CHECK(cudaMemset(mg_table, 0, 64 * sizeof(int)));
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < 64; ++i) EXPECT(mg_table[i] == 0, "after cudaMemset table[%d] = %d", i, mg_table[i]);
    EXPECT(mg_table[64] == 64 + added, "cudaMemset reached past its end: table[64] = %d", mg_table[64]);
    printf("symbol copies, a copy and a memset on managed variables: ok\n");
    return pass();
}
