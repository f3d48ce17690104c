// The software test driver's tensor map descriptor: what its cuTensorMapEncode* write into the 128 opaque
// bytes of a CUtensorMap (the real format is undocumented; this one is the software driver's own), and what
// host kernels that take a CUtensorMap read back. Little-endian, all fields at fixed offsets:
//
//   offset size field
//   0      4    magic 0x4d545356 ("VSTM")
//   4      1    kind: 0 tiled, 1 im2col, 2 im2col wide
//   5      1    CUtensorMapDataType
//   6      1    rank (1..5)
//   7      1    bytes per element (0 for the packed sub-byte types)
//   8      8    global address
//   16     40   global dimensions, 5 x u64 (unused ones 1)
//   56     32   global strides in bytes of dimensions 1..4, 4 x u64 (dimension 0 is dense)
//   88     5    box dimensions (tiled), 5 x u8 (1..256 stored as value-1)
//   93     5    element strides, 5 x u8 (1..8)
//   98     1    interleave, 99 swizzle, 100 L2 promotion, 101 OOB fill (their enums)
//   102    2    channels per pixel (im2col), u16
//   104    2    pixels per column (im2col), u16
//   106    3    lower corner (im2col, i8 each; im2col wide: [0] the width)
//   109    3    upper corner (likewise)
//   112    1    im2col wide mode
//   113    15   zero
#pragma once

#include <cstdint>
#include <cstring>

namespace vcuda::soft {

inline constexpr uint32_t tensor_map_magic = 0x4d545356;

struct tensor_map_desc {
    uint32_t magic;
    uint8_t kind, data_type, rank, element_bytes;
    uint64_t address;
    uint64_t dims[5];
    uint64_t strides[4];
    uint8_t box_minus_1[5];
    uint8_t element_strides[5];
    uint8_t interleave, swizzle, l2_promotion, oob_fill;
    uint16_t channels_per_pixel, pixels_per_column;
    int8_t lower[3], upper[3];
    uint8_t wide_mode;
    uint8_t zero[15];

    uint32_t box(int i) const { return uint32_t{box_minus_1[i]} + 1; }
};
static_assert(sizeof(tensor_map_desc) == 128, "a CUtensorMap is 128 bytes");

// The descriptor in `opaque` (a CUtensorMap's bytes); false when they are not one of this driver's.
inline bool decode_tensor_map(const void* opaque, tensor_map_desc& out) {
    std::memcpy(&out, opaque, sizeof out);
    return out.magic == tensor_map_magic && out.rank >= 1 && out.rank <= 5;
}

}  // namespace vcuda::soft
