// Minimal safetensors reader and writer: an 8-byte little-endian header length, a JSON header
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data.
// Every failure is one Error naming the file, the tensor and the fix.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/dtypes.hpp"

namespace hisparse {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  ///< offset of the first byte, relative to the data section
  std::uint64_t end = 0;    ///< one past the last byte
};

struct SafetensorsIndex {
  std::filesystem::path file;
  std::uint64_t data_start = 0;           ///< absolute file offset of the data section
  std::vector<SafetensorsEntry> tensors;  ///< in data order
};

/// Reads and checks the header: length within the file, JSON object, each entry's dtype, shape
/// and offsets (end - begin = elements x dtype size, inside the data section, no overlaps).
[[nodiscard]] SafetensorsIndex read_safetensors_index(const std::filesystem::path& file);

/// Reads one tensor's raw little-endian bytes (entry.end - entry.begin of them).
[[nodiscard]] std::vector<std::uint8_t> read_safetensors_bytes(const SafetensorsIndex& index,
                                                               const SafetensorsEntry& entry);

/// Reads one tensor and converts it to float (F32, BF16, F16 and F8_E4M3 without block scales).
[[nodiscard]] std::vector<float> read_safetensors_floats(const SafetensorsIndex& index,
                                                         const SafetensorsEntry& entry);

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> bytes;  ///< raw little-endian data
};
/// Writes tensors (in the given order) to `file`; for tests and captured workloads.
void write_safetensors(const std::filesystem::path& file,
                       const std::vector<SafetensorsTensor>& tensors);
/// Raw bytes of floats stored as `dtype` (f32, bf16, f16 or fp8_e4m3), for write_safetensors.
[[nodiscard]] std::vector<std::uint8_t> encode_floats(const std::vector<float>& values,
                                                      DType dtype);

}  // namespace hisparse
