// IPC handles as the application holds them (server/ipc.hpp makes and checks them): the 64 opaque bytes of a
// CUipcMemHandle or CUipcEventHandle, or, for a shareable handle of a physical allocation, a file descriptor
// of the application's: a sealed memfd that holds "vcudaSH1" and the same 64 bytes, which the importing
// process's vcuda reads back (any process of the same tenant on the same server may; the descriptor travels
// between processes as the driver's own would, over a Unix socket or by inheritance). runs on: the calling
// application thread (no shared state).
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include "client/plain_call.hpp"

namespace vcuda::client {

// What an IPC handle stands for: ipc_export's and ipc_open's `what` (server/handlers_ipc.cpp).
enum ipc_what : unsigned { what_memory = 0, what_event = 1, what_allocation = 2, what_pool = 3 };

inline constexpr size_t ipc_handle_bytes = 64;
using ipc_bytes = std::array<std::byte, ipc_handle_bytes>;

// A new descriptor holding `handle` (not close-on-exec: it is the application's, as the driver's would be);
// -1 with errno set on failure.
int shareable_descriptor(const ipc_bytes& handle);
// The handle a descriptor of shareable_descriptor holds; false when `fd` is not one.
bool read_shareable_descriptor(int fd, ipc_bytes& out);
// Logs why the server refused an IPC call (its answer's detail), once per reason, as a warning.
void log_ipc_refusal(const char* call, int result, const std::string& detail);
// Logs the server's refusal of `call` (log_ipc_refusal) and returns its result.
CUresult refused_by_server(const char* call, CUresult rc, const plain_call& c);
// Sends `c`, an ipc_export the caller filled, and writes the application's descriptor of the handle it
// answers to *fd_out (cuMemExportToShareableHandle, cuMemPoolExportToShareableHandle).
CUresult export_descriptor(plain_call& c, const char* call, void* fd_out);
// The handle in the application's descriptor `os_handle`; false, logged, when it is not one vcuda made.
bool handle_in_descriptor(void* os_handle, const char* call, ipc_bytes& out);

}  // namespace vcuda::client
