// The output of the record mode (VCUDA_TRACE, client/TRACE.md): one line per driver call or export-table slot
// call, built in a buffer on the caller's stack and written with a single write(2), so that lines of
// different threads and processes never mix and a crash loses nothing already returned. runs on: any thread.
// Depends on nothing but the C library (and the header-only client/error_names.hpp), so that tests can link
// it without the rest of the client.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace vcuda::client::trace {

// Opens the output named by VCUDA_TRACE's value: "1" or "stderr" for standard error, otherwise a file path,
// opened for appending (several processes may share one file); "%p" in the path becomes the process id.
// Returns false, with the reason on stderr, when the file cannot be opened.
bool open_output(const char* spec);
// For tests: writes to `fd` from now on.
void set_output_fd(int fd);
// Writes one raw line (a '\n' is added), e.g. a "# ..." comment.
void write_raw(const char* text);

// Seconds since the output was opened, as the line prefix shows them.
uint64_t now_ns();
// Reads `n` bytes at `addr` into `out` without faulting (process_vm_readv on this process, or a pipe when
// that is refused); false when any of the bytes is not readable.
bool safe_read(const void* addr, void* out, size_t n);
// True when `v` can be a user-space address worth reading (not null, not a small integer, below 2^47).
inline bool plausible_pointer(uint64_t v) { return v >= 0x10000 && v < (uint64_t{1} << 47); }
// "CUDA_SUCCESS" for 0 ...; null for a code cuda.h does not name.
const char* result_name(int rc);

// A line under construction; overlong lines are cut and end in "...".
class line {
  public:
    static constexpr size_t capacity = 8192;

    void put(const char* s);
    void put(const char* s, size_t n);
    void put_char(char c);
    void dec(long long v);
    void udec(unsigned long long v);
    void hex(unsigned long long v);
    void flt(double v);
    void quoted(const char* s, size_t max_chars);  // "text" with C escapes; `null` for a null pointer
    void bytes(const void* p, size_t n);           // {0x.., 0x..}: 8-byte words, then the rest byte by byte
    void uuid(const unsigned char* b);             // 8-4-4-4-12 lower-case hex
    // The common prefix: seconds since start, pid, thread id and nesting depth (when inside another call).
    void prefix(uint64_t start_ns, int depth);
    void emit();  // adds '\n' and writes the line

  private:
    char buf_[capacity];
    size_t n_ = 0;
    bool cut_ = false;
};

// Calls of this thread that are in flight through the trace (a callback or the real driver calling back into
// an exported function makes the inner call's depth 1).
int& depth();
// VCUDA_TRACE_ENTER=1: also write "> name" before each call, for calls that never return (hangs, crashes).
extern bool enter_lines;

// One traced call of a driver function: stamped before the real function runs, formatted and written after it
// returned (the arguments in declaration order, output parameters with the value the call wrote).
class call {
  public:
    explicit call(const char* name);
    void done();  // the real function returned: stamps the end

    template <class T>
    void arg(const char* n, const T& v) {
        key(n);
        value(v);
    }
    void hex(const char* n, unsigned long long v) {
        key(n);
        l_.hex(v);
    }
    void str(const char* n, const char* s) {
        key(n);
        l_.quoted(s, 512);
    }
    void result_arg(const char* n, int rc);
    void uuid(const char* n, const void* p);  // const CUuuid*: the 16 bytes, when not null
    // char* filled by the call, with its capacity `len`: the text when the call succeeded.
    void strbuf(const char* n, const char* s, long long len, bool ok);
    // const char** filled by the call: the string it points to afterwards.
    void out_str(const char* n, const char* const* p, bool ok);
    void out_uuid(const char* n, const void* p, bool ok);
    // A pointer parameter the call writes through: "name=ADDR->VALUE", VALUE read after a successful call
    // (for an array, its first element); only the address for pointers to structures and void.
    template <class T>
    void out(const char* n, T* p, bool ok) {
        key(n);
        l_.hex(reinterpret_cast<uintptr_t>(p));
        using U = std::remove_cv_t<T>;
        if constexpr (std::is_arithmetic_v<U> || std::is_enum_v<U> || std::is_pointer_v<U>) {
            if (ok && p) {
                l_.put("->", 2);
                value(static_cast<U>(*p));
            }
        }
    }
    template <class T>
    void out_hex(const char* n, T* p, bool ok) {
        key(n);
        l_.hex(reinterpret_cast<uintptr_t>(p));
        if (ok && p) {
            l_.put("->", 2);
            l_.hex(static_cast<unsigned long long>(*p));
        }
    }

    void note(const char* text) { note_ = text; }  // static text, written after the time
    void result(int rc);                           // ") = NAME 1.2us" and the note
    line& text() { return l_; }
    void emit();  // writes the line; errno is as the real function left it
    void end(int rc) {
        result(rc);
        emit();
    }

  private:
    void key(const char* n);
    template <class T>
    void value(const T& v) {
        if constexpr (std::is_pointer_v<T>) {  // strings too: their address
            l_.hex(reinterpret_cast<uintptr_t>(v));
        } else if constexpr (std::is_same_v<T, bool>) {
            l_.dec(v ? 1 : 0);
        } else if constexpr (std::is_enum_v<T> || (std::is_integral_v<T> && std::is_signed_v<T>)) {
            l_.dec(static_cast<long long>(v));
        } else if constexpr (std::is_integral_v<T>) {
            l_.udec(static_cast<unsigned long long>(v));
        } else if constexpr (std::is_floating_point_v<T>) {
            l_.flt(static_cast<double>(v));
        } else {
            static_assert(std::is_trivially_copyable_v<T>,
                          "a structure passed by value is printed as its bytes");
            l_.bytes(&v, sizeof v);
        }
    }

    const char* name_;
    uint64_t start_;
    uint64_t end_ = 0;
    int depth_;
    int errno_ = 0;
    bool first_ = true;
    const char* note_ = nullptr;
    line l_;
};

}  // namespace vcuda::client::trace
