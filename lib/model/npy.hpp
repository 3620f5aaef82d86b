// Reader and writer for NumPy .npy files (format versions 1.0, 2.0 and 3.0), enough for captured
// float tensors: the magic "\x93NUMPY", a version, a little-endian header length (2 bytes in 1.0,
// 4 bytes in 2.0 / 3.0), a Python dict literal {'descr': '<f4', 'fortran_order': False,
// 'shape': (2, 3), } and then the elements in C order.
//
// Element types: '<f4' (float32), '<f2' (float16), '<f8' (float64) and '<u2', which this toolkit
// reads as bfloat16 bit patterns (NumPy has no bfloat16; `t.view(torch.int16).numpy()
// .view('<u2')` stores a bf16 tensor's bits); and the integers '<i4' and '<i8' (recorded top-k
// indices). Which types a file may hold is the reader's caller's business (captured keys must be
// floats, selections integers). Every failure is one Error naming the file, what is wrong and how
// to write the file instead.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace hisparse {

enum class NpyType : std::uint8_t { f32, f16, bf16, f64, i32, i64 };

/// The descr a file of this type carries: "<f4", "<f2", "<u2", "<f8", "<i4", "<i8".
[[nodiscard]] std::string_view npy_descr(NpyType type) noexcept;
[[nodiscard]] std::size_t npy_item_size(NpyType type) noexcept;
[[nodiscard]] bool npy_is_integer(NpyType type) noexcept;

struct NpyArray {
  int major = 1;  ///< format version read (1, 2 or 3; minor is always 0)
  NpyType type = NpyType::f32;
  std::vector<std::int64_t> shape;  ///< () for a scalar
  std::vector<std::uint8_t> data;   ///< the raw little-endian elements, C order

  [[nodiscard]] std::uint64_t elements() const noexcept;
  /// Every element converted to float (f64 and integers beyond 2^24 round to nearest).
  [[nodiscard]] std::vector<float> floats() const;
  /// Every element of an integer array (i32, i64); throws Error for a float array.
  [[nodiscard]] std::vector<std::int64_t> integers() const;
  /// Element i (< elements()) of an integer array, without copying the others; throws Error for
  /// a float array.
  [[nodiscard]] std::int64_t integer(std::size_t i) const;
};

/// Parses a whole .npy file held in memory; `where` names it in errors (usually the path).
[[nodiscard]] NpyArray parse_npy(std::string_view bytes, const std::string& where);
/// Reads and parses `file`.
[[nodiscard]] NpyArray read_npy(const std::filesystem::path& file);

/// Writes `values` as a .npy file of `type` (version 1.0, header padded to 64 bytes like
/// numpy.save). `shape` must hold values.size() elements; integer types take the values rounded.
void write_npy(const std::filesystem::path& file, NpyType type,
               const std::vector<std::int64_t>& shape, const std::vector<float>& values);
/// The bytes write_npy would write (for tests and fuzzing).
[[nodiscard]] std::string encode_npy(NpyType type, const std::vector<std::int64_t>& shape,
                                     const std::vector<float>& values, int major = 1);
/// Integer arrays (i32, i64) exactly: a value that does not fit int32 throws.
void write_npy_integers(const std::filesystem::path& file, NpyType type,
                        const std::vector<std::int64_t>& shape,
                        const std::vector<std::int64_t>& values);
[[nodiscard]] std::string encode_npy_integers(NpyType type, const std::vector<std::int64_t>& shape,
                                              const std::vector<std::int64_t>& values,
                                              int major = 1);

}  // namespace hisparse
