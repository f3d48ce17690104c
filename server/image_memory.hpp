// How much device memory loading a code image makes the driver hold, read from the image before the driver
// sees it, so that a module load is charged to the session's quota (handle_module_load) and not only what
// the session allocates itself: a `__device__ char buf[1 << 34]` costs the image nothing (its section holds
// no bytes) and the driver 16 GiB. There is no driver call that tells a module's footprint (cuMemGetInfo is
// the whole process's, shared by every session), so the image is read:
// - ELF (a cubin): the sections the driver places in device memory (flag SHF_ALLOC): code, constant banks,
//   initialised and zero-filled globals; exactly what the image asks for, before the driver's alignment.
//   Shared-memory sections (.nv.shared*) are per-block on-chip space and local ones (.nv.local*) per-thread
//   space reserved at launch, not module memory: not counted.
// - PTX: the .global and .const variables it declares (not .extern ones), element size × vector width ×
//   dimensions. The code the driver compiles from it is not known before it compiles it and is not counted
//   (it is a few hundred KiB even for large libraries).
// - fatbin: the driver loads one of its entries (the SASS for the GPU, else it compiles a PTX entry), so the
//   largest entry counts. An entry compressed (LZ4 or Zstd; nvcc compresses PTX entries by default) is
//   counted at its uncompressed size: its globals are not read (no decompressor in the server).
// - a fatbin wrapper of version 2 loads its linked fatbins too: their sum.
// A malformed ELF or fatbin (tables out of the image) answers nullopt; the load is refused.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace vcuda::server {

// `image`: one image as the client sent it (ELF, fatbin or PTX). Saturates at UINT64_MAX.
std::optional<uint64_t> image_device_bytes(std::span<const std::byte> image);

// The parts handle_module_load keeps (each 8-byte aligned and zero-padded): `format` 0 one bare image, 1 and
// 2 a wrapper's fatbin, and for 2 its linked fatbins after it.
std::optional<uint64_t> load_device_bytes(uint64_t format, const std::vector<std::vector<uint64_t>>& parts);

}  // namespace vcuda::server
