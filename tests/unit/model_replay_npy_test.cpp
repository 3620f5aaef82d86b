// The .npy reader: hand-written headers of every supported version and element type, round
// trips through the writer, and one exact message per kind of bad file.
#include "model/npy.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "core/dtypes.hpp"
#include "core/error.hpp"

namespace hisparse {
namespace {

// A .npy file as bytes: magic, version, header length of the version's width, header, data.
std::string npy_bytes(int major, const std::string& header, const std::string& data) {
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  const std::size_t width = major == 1 ? 2 : 4;
  for (std::size_t i = 0; i < width; ++i)
    out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  return out + header + data;
}

std::string f32_data(std::initializer_list<float> values) {
  std::string out;
  for (float v : values) out.append(reinterpret_cast<const char*>(&v), 4);
  return out;
}

std::string error_of(const std::string& bytes) {
  try {
    (void)parse_npy(bytes, "x.npy");
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

const std::string kHeader23 = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n";

TEST(ModelReplayNpy, ReadsHandWrittenVersion1) {
  const NpyArray a = parse_npy(npy_bytes(1, kHeader23, f32_data({1, 2, 3, 4, 5, -6.5f})), "x");
  EXPECT_EQ(a.major, 1);
  EXPECT_EQ(a.type, NpyType::f32);
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(a.elements(), 6u);
  EXPECT_EQ(a.floats(), (std::vector<float>{1, 2, 3, 4, 5, -6.5f}));
}

TEST(ModelReplayNpy, ReadsVersions2And3DoubleQuotesAndOddSpacing) {
  const std::string header = "{\"shape\":(4,),\"fortran_order\":False,\"descr\":\"<f4\"}";
  for (int major : {2, 3}) {
    const NpyArray a = parse_npy(npy_bytes(major, header, f32_data({0.5f, 1, 2, 3})), "x");
    EXPECT_EQ(a.major, major);
    EXPECT_EQ(a.shape, std::vector<std::int64_t>{4});
    EXPECT_EQ(a.floats()[0], 0.5f);
  }
  // A scalar has shape (); Python 2 files wrote dimensions as 3L.
  const NpyArray scalar = parse_npy(
      npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': ()}", f32_data({7})), "x");
  EXPECT_TRUE(scalar.shape.empty());
  EXPECT_EQ(scalar.floats(), std::vector<float>{7});
  const NpyArray old =
      parse_npy(npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1L, 2L), }",
                          f32_data({1, 2})),
                "x");
  EXPECT_EQ(old.shape, (std::vector<std::int64_t>{1, 2}));
  // Zero-sized arrays hold no data.
  const NpyArray empty = parse_npy(
      npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 5), }", ""), "x");
  EXPECT_EQ(empty.elements(), 0u);
}

TEST(ModelReplayNpy, DecodesF16Bf16AndF64ByHand) {
  // f16 0x3c00 = 1, 0xc000 = -2; bf16 0x3fc0 = 1.5, 0xbf80 = -1; f64 0.25.
  const std::string f16 = std::string("\x00\x3c\x00\xc0", 4);
  const NpyArray h = parse_npy(
      npy_bytes(1, "{'descr': '<f2', 'fortran_order': False, 'shape': (2,), }", f16), "x");
  EXPECT_EQ(h.floats(), (std::vector<float>{1, -2}));
  const std::string bf16 = std::string("\xc0\x3f\x80\xbf", 4);
  const NpyArray b = parse_npy(
      npy_bytes(1, "{'descr': '<u2', 'fortran_order': False, 'shape': (2,), }", bf16), "x");
  EXPECT_EQ(b.type, NpyType::bf16);
  EXPECT_EQ(b.floats(), (std::vector<float>{1.5f, -1}));
  const double quarter = 0.25;
  const NpyArray d =
      parse_npy(npy_bytes(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }",
                          std::string(reinterpret_cast<const char*>(&quarter), 8)),
                "x");
  EXPECT_EQ(d.floats(), std::vector<float>{0.25f});
}

TEST(ModelReplayNpy, WriterRoundTripsEveryTypeAndPadsLikeNumpy) {
  const std::vector<float> values{0, 1, -2.5f, 3.75f, 1024, -0.125f};
  for (NpyType t : {NpyType::f32, NpyType::f16, NpyType::bf16, NpyType::f64}) {
    for (int major : {1, 2, 3}) {
      const std::string bytes = encode_npy(t, {3, 2}, values, major);
      const std::size_t prefix = major == 1 ? 10 : 12;
      EXPECT_EQ((bytes.size() - values.size() * npy_item_size(t)) % 64, 0u);  // data aligned
      EXPECT_EQ(bytes[bytes.size() - values.size() * npy_item_size(t) - 1], '\n');
      EXPECT_EQ(bytes.substr(prefix, 10), "{'descr': ");
      const NpyArray a = parse_npy(bytes, "x");
      EXPECT_EQ(a.type, t);
      EXPECT_EQ(a.major, major);
      EXPECT_EQ(a.floats(), values) << npy_descr(t);
    }
  }
  const auto file = std::filesystem::temp_directory_path() / "hisparse_replay_npy_test.npy";
  write_npy(file, NpyType::bf16, {2}, {1.5f, -3});
  EXPECT_EQ(read_npy(file).floats(), (std::vector<float>{1.5f, -3}));
  std::filesystem::remove(file);
}

TEST(ModelReplayNpy, ReadsAndWritesIntegerArraysExactly) {
  // Hand-written int32 data: -1 (padding in a top-k dump), 0 and the int32 extremes.
  std::string i32;
  for (std::int32_t v : {-1, 0, 2147483647, -2147483647 - 1})
    i32.append(reinterpret_cast<const char*>(&v), 4);
  const NpyArray a = parse_npy(
      npy_bytes(1, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 2), }", i32), "x");
  EXPECT_EQ(a.type, NpyType::i32);
  EXPECT_TRUE(npy_is_integer(a.type));
  EXPECT_EQ(a.integers(), (std::vector<std::int64_t>{-1, 0, 2147483647, -2147483648LL}));
  EXPECT_EQ(a.floats()[0], -1.0f);

  const std::vector<std::int64_t> wide{-1, std::int64_t{1} << 40, 7};
  for (NpyType t : {NpyType::i32, NpyType::i64}) {
    const std::vector<std::int64_t> values =
        t == NpyType::i32 ? std::vector<std::int64_t>{-1, 5, 1 << 30} : wide;
    const NpyArray b = parse_npy(encode_npy_integers(t, {3}, values), "x");
    EXPECT_EQ(b.type, t);
    EXPECT_EQ(b.integers(), values) << npy_descr(t);
  }
  EXPECT_EQ(parse_npy(encode_npy(NpyType::i64, {2}, {3.0f, -2.0f}), "x").integers(),
            (std::vector<std::int64_t>{3, -2}));
  EXPECT_FALSE(npy_is_integer(NpyType::f32));
  try {
    (void)parse_npy(encode_npy(NpyType::f32, {1}, {1.0f}), "x").integers();
    FAIL() << "integers() of a float array did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "NpyArray::integers: the array holds '<f4', not integers; check "
              "npy_is_integer(type) before asking for integers");
  }
  try {
    (void)encode_npy_integers(NpyType::i32, {1}, {std::int64_t{1} << 31});
    FAIL() << "2^31 was written as int32";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "write_npy: 2147483648 does not fit int32; write int64 instead");
  }
}

TEST(ModelReplayNpy, BadFilesNameTheProblemAndTheFix) {
  EXPECT_EQ(error_of("PK\x03\x04 zip"),
            "x.npy: not a .npy file (it does not start with the magic \\x93NUMPY); write the "
            "array with numpy.save; .npz archives must be unzipped first");
  std::string v4 = npy_bytes(1, kHeader23, "");
  v4[6] = 4;
  EXPECT_EQ(error_of(v4),
            "x.npy: format version 4.0 is not supported; write version 1.0, 2.0 or 3.0 "
            "(numpy.save does)");
  EXPECT_EQ(error_of(npy_bytes(1, kHeader23, "").substr(0, 40)),
            "x.npy: header length 60 exceeds the file (40 bytes) or the 1 MiB limit; the file "
            "is truncated or corrupt");
  EXPECT_EQ(error_of(npy_bytes(1, kHeader23, f32_data({1, 2, 3}))),
            "x.npy: data holds 12 bytes but shape (2, 3) of '<f4' needs 24; the file is "
            "truncated; write it again");
  EXPECT_EQ(error_of(npy_bytes(1, kHeader23, f32_data({1, 2, 3, 4, 5, 6, 7}))),
            "x.npy: data holds 28 bytes but shape (2, 3) of '<f4' needs 24; the header does not "
            "match the data; write the file again");
  EXPECT_EQ(error_of(npy_bytes(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }",
                               f32_data({1}))),
            "x.npy: element type '>f4' is not supported; store little-endian data "
            "(a.astype('<f4'))");
  EXPECT_EQ(error_of(npy_bytes(1, "{'descr': '<u4', 'fortran_order': False, 'shape': (1,), }",
                               f32_data({1}))),
            "x.npy: element type '<u4' is not supported; store float32 ('<f4'), float16 "
            "('<f2'), float64 ('<f8'), bfloat16 bits as uint16 ('<u2') or integers as int32 "
            "('<i4') or int64 ('<i8'), e.g. a.astype(numpy.float32)");
  EXPECT_EQ(error_of(npy_bytes(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }",
                               f32_data({1}))),
            "x.npy: the array is stored in Fortran (column-major) order; save a C-ordered copy: "
            "numpy.save(path, numpy.ascontiguousarray(a))");
  EXPECT_EQ(error_of(npy_bytes(
                1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", "")),
            "x.npy: structured arrays (a list descr) are not supported; save one plain float "
            "array per file");
  EXPECT_EQ(error_of(npy_bytes(1, "{'descr': '<f4', 'shape': (1,), }", f32_data({1}))),
            "x.npy: header lacks 'fortran_order'; write the array with numpy.save");
  EXPECT_EQ(
      error_of(
          npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}", "")),
      "x.npy: header dict is malformed: expected a string, True, False or a tuple at header byte "
      "65, found '1}'; write the array with numpy.save");
  EXPECT_EQ(error_of(npy_bytes(1,
                               "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), "
                               "'extra': 'x'}",
                               f32_data({1}))),
            "x.npy: header has an unexpected key 'extra'; write the array with numpy.save (its "
            "header holds only descr, fortran_order and shape)");
  EXPECT_EQ(
      error_of(npy_bytes(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3)}", "")),
      "x.npy: header dict is malformed: expected a non-negative integer at header byte 54, "
      "found '-3)}'; write the array with numpy.save");
  EXPECT_EQ(
      error_of(npy_bytes(1,
                         "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, "
                         "4611686018427387904)}",
                         "")),
      "x.npy: shape (4611686018427387904, 4611686018427387904) is too large; the header "
      "is corrupt; rewrite the file");
  EXPECT_EQ(error_of(npy_bytes(1, "{'descr': '<f4'\x01", "")),
            "x.npy: header dict is malformed: expected ',' or '}' after a value at header byte "
            "15, found '\\x01'; write the array with numpy.save");
  const auto missing = std::filesystem::temp_directory_path() / "hisparse_no_such.npy";
  try {
    (void)read_npy(missing);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              missing.string() + ": cannot open the .npy file; check the path and its permissions");
  }
}

}  // namespace
}  // namespace hisparse
