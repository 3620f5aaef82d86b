#include "model/npy.hpp"

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/dtypes.hpp"
#include "core/error.hpp"

namespace hisparse {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
constexpr std::uint64_t kMaxHeader = 1u << 20;  // numpy itself refuses far smaller headers
constexpr std::string_view kRewrite = "write the array with numpy.save";

// A value of the header dict: a string, a bool, a tuple of non-negative integers, or a list
// (only as a structured descr, which is rejected with its own message).
struct Value {
  enum class Kind { text, boolean, tuple, list } kind = Kind::text;
  std::string text;
  bool boolean = false;
  std::vector<std::int64_t> dims;
};

// Recursive-descent reader of the small Python literal numpy writes. Errors name the byte offset
// within the header, which is what someone inspecting the file with `head -c` needs.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& where) : s_(text), where_(where) {}

  std::vector<std::pair<std::string, Value>> dict() {
    std::vector<std::pair<std::string, Value>> items;
    skip_space();
    expect('{', "a Python dict starting with '{'");
    for (;;) {
      skip_space();
      if (peek() == '}') {
        ++pos_;
        break;
      }
      std::string key = quoted();
      skip_space();
      expect(':', "':' after a key");
      skip_space();
      items.emplace_back(std::move(key), value());
      skip_space();
      if (peek() == ',') {
        ++pos_;
      } else if (peek() != '}') {
        fail("',' or '}' after a value");
      }
    }
    skip_space();
    if (pos_ != s_.size()) fail("the end of the header after '}'");
    return items;
  }

 private:
  [[nodiscard]] char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < s_.size() &&
           (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\t' || s_[pos_] == '\r'))
      ++pos_;
  }
  [[noreturn]] void fail(std::string_view expected) const {
    const std::string seen =
        pos_ < s_.size() ? fmt::format("'{}'", printable(s_.substr(pos_, 12))) : "the end";
    throw Error(where_,
                fmt::format("header dict is malformed: expected {} at header byte {}, found {}",
                            expected, pos_, seen),
                std::string(kRewrite));
  }
  static std::string printable(std::string_view raw) {
    std::string out;
    for (char c : raw) {
      const auto u = static_cast<unsigned char>(c);
      out += (u >= 0x20 && u < 0x7f) ? std::string(1, c) : fmt::format("\\x{:02x}", u);
    }
    return out;
  }
  void expect(char c, std::string_view what) {
    if (peek() != c) fail(what);
    ++pos_;
  }
  std::string quoted() {
    const char q = peek();
    if (q != '\'' && q != '"') fail("a quoted string");
    ++pos_;
    const std::size_t end = s_.find(q, pos_);
    if (end == std::string_view::npos) fail("a closing quote");
    std::string out(s_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return out;
  }
  bool word(std::string_view w) {
    if (s_.substr(pos_, w.size()) != w) return false;
    pos_ += w.size();
    return true;
  }
  std::int64_t integer() {
    if (peek() < '0' || peek() > '9') fail("a non-negative integer");
    std::uint64_t v = 0;
    constexpr std::uint64_t kLimit = std::uint64_t{1} << 62;
    while (peek() >= '0' && peek() <= '9') {
      const auto digit = static_cast<std::uint64_t>(peek() - '0');
      if (v > (kLimit - digit) / 10) fail("a dimension below 2^62");
      v = v * 10 + digit;
      ++pos_;
    }
    if (peek() == 'L') ++pos_;  // Python 2 long suffix in old files
    return static_cast<std::int64_t>(v);
  }
  Value value() {
    Value v;
    const char c = peek();
    if (c == '\'' || c == '"') {
      v.text = quoted();
    } else if (word("True")) {
      v.kind = Value::Kind::boolean;
      v.boolean = true;
    } else if (word("False")) {
      v.kind = Value::Kind::boolean;
    } else if (c == '(') {
      v.kind = Value::Kind::tuple;
      ++pos_;
      for (;;) {
        skip_space();
        if (peek() == ')') {
          ++pos_;
          break;
        }
        v.dims.push_back(integer());
        skip_space();
        if (peek() == ',') {
          ++pos_;
        } else if (peek() != ')') {
          fail("',' or ')' in the shape tuple");
        }
      }
    } else if (c == '[') {
      v.kind = Value::Kind::list;
      skip_list();
    } else {
      fail("a string, True, False or a tuple");
    }
    return v;
  }
  void skip_list() {
    int depth = 0;
    do {
      if (pos_ >= s_.size()) fail("a closing ']'");
      const char c = s_[pos_++];
      if (c == '\'' || c == '"') {
        const std::size_t end = s_.find(c, pos_);
        if (end == std::string_view::npos) fail("a closing quote");
        pos_ = end + 1;
      } else if (c == '[') {
        ++depth;
      } else if (c == ']') {
        --depth;
      }
    } while (depth > 0);
  }

  std::string_view s_;
  std::size_t pos_ = 0;
  const std::string& where_;
};

std::optional<NpyType> type_of_descr(std::string_view d) {
  if (d == "<f4") return NpyType::f32;
  if (d == "<f2") return NpyType::f16;
  if (d == "<u2") return NpyType::bf16;
  if (d == "<f8") return NpyType::f64;
  if (d == "<i4") return NpyType::i32;
  if (d == "<i8") return NpyType::i64;
  return std::nullopt;
}

std::string fix_for_descr(std::string_view d) {
  if (!d.empty() && d[0] == '>')
    return fmt::format("store little-endian data (a.astype('<{}'))", d.substr(1));
  return "store float32 ('<f4'), float16 ('<f2'), float64 ('<f8'), bfloat16 bits as uint16 "
         "('<u2') or integers as int32 ('<i4') or int64 ('<i8'), e.g. a.astype(numpy.float32)";
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  if (shape.size() == 1) return fmt::format("({},)", shape[0]);
  return fmt::format("({})", fmt::join(shape, ", "));
}

// Element i of little-endian int32 or int64 data (this reader only runs on little-endian hosts,
// as the float cases' memcpy assumes too).
std::int64_t integer_at(const std::uint8_t* p, NpyType type, std::size_t i) {
  if (type == NpyType::i32) {
    std::int32_t v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  std::int64_t v;
  std::memcpy(&v, p + 8 * i, 8);
  return v;
}

}  // namespace

std::string_view npy_descr(NpyType type) noexcept {
  switch (type) {
    case NpyType::f32:
      return "<f4";
    case NpyType::f16:
      return "<f2";
    case NpyType::bf16:
      return "<u2";
    case NpyType::f64:
      return "<f8";
    case NpyType::i32:
      return "<i4";
    case NpyType::i64:
      return "<i8";
  }
  return "?";
}

std::size_t npy_item_size(NpyType type) noexcept {
  switch (type) {
    case NpyType::f32:
      return 4;
    case NpyType::f16:
    case NpyType::bf16:
      return 2;
    case NpyType::f64:
    case NpyType::i64:
      return 8;
    case NpyType::i32:
      return 4;
  }
  return 0;
}

bool npy_is_integer(NpyType type) noexcept {
  return type == NpyType::i32 || type == NpyType::i64;
}

std::uint64_t NpyArray::elements() const noexcept {
  std::uint64_t n = 1;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

std::vector<float> NpyArray::floats() const {
  const std::size_t n = data.size() / npy_item_size(type);
  std::vector<float> out(n);
  const std::uint8_t* p = data.data();
  for (std::size_t i = 0; i < n; ++i) {
    switch (type) {
      case NpyType::f32:
        std::memcpy(&out[i], p + 4 * i, 4);
        break;
      case NpyType::f16:
        out[i] = f16_to_float(static_cast<std::uint16_t>(p[2 * i] | (p[2 * i + 1] << 8)));
        break;
      case NpyType::bf16:
        out[i] = bf16_to_float(static_cast<std::uint16_t>(p[2 * i] | (p[2 * i + 1] << 8)));
        break;
      case NpyType::f64: {
        double d;
        std::memcpy(&d, p + 8 * i, 8);
        out[i] = static_cast<float>(d);
        break;
      }
      case NpyType::i32:
      case NpyType::i64:
        out[i] = static_cast<float>(integer_at(p, type, i));
        break;
    }
  }
  return out;
}

std::int64_t NpyArray::integer(std::size_t i) const {
  if (!npy_is_integer(type))
    throw Error("NpyArray::integers",
                fmt::format("the array holds '{}', not integers", npy_descr(type)),
                "check npy_is_integer(type) before asking for integers");
  return integer_at(data.data(), type, i);
}

std::vector<std::int64_t> NpyArray::integers() const {
  std::vector<std::int64_t> out(data.size() / npy_item_size(type));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = integer(i);
  return out;
}

NpyArray parse_npy(std::string_view bytes, const std::string& where) {
  if (bytes.size() < 10 || bytes.substr(0, kMagic.size()) != kMagic)
    throw Error(where, "not a .npy file (it does not start with the magic \\x93NUMPY)",
                fmt::format("{}; .npz archives must be unzipped first", kRewrite));
  NpyArray a;
  const auto major = static_cast<unsigned char>(bytes[6]);
  const auto minor = static_cast<unsigned char>(bytes[7]);
  if (major < 1 || major > 3 || minor != 0)
    throw Error(where, fmt::format("format version {}.{} is not supported", major, minor),
                "write version 1.0, 2.0 or 3.0 (numpy.save does)");
  a.major = major;
  const std::size_t len_bytes = major == 1 ? 2 : 4;
  if (bytes.size() < 8 + len_bytes)
    throw Error(where, "file ends inside the header length", "the file is truncated");
  std::uint64_t header_len = 0;
  for (std::size_t i = len_bytes; i-- > 0;)
    header_len = (header_len << 8) | static_cast<unsigned char>(bytes[8 + i]);
  const std::uint64_t header_start = 8 + len_bytes;
  if (header_len > kMaxHeader || header_len > bytes.size() - header_start)
    throw Error(where,
                fmt::format("header length {} exceeds the file ({} bytes) or the 1 MiB limit",
                            header_len, bytes.size()),
                "the file is truncated or corrupt");
  std::string_view header = bytes.substr(header_start, header_len);
  const auto items = HeaderParser(header, where).dict();

  const Value* descr = nullptr;
  const Value* fortran = nullptr;
  const Value* shape = nullptr;
  for (const auto& [key, v] : items) {
    if (key == "descr") {
      descr = &v;
    } else if (key == "fortran_order") {
      fortran = &v;
    } else if (key == "shape") {
      shape = &v;
    } else {
      throw Error(
          where, fmt::format("header has an unexpected key '{}'", key),
          fmt::format("{} (its header holds only descr, fortran_order and shape)", kRewrite));
    }
  }
  if (!descr || !fortran || !shape)
    throw Error(where,
                fmt::format("header lacks '{}'", !descr     ? "descr"
                                                 : !fortran ? "fortran_order"
                                                            : "shape"),
                std::string(kRewrite));
  if (descr->kind == Value::Kind::list)
    throw Error(where, "structured arrays (a list descr) are not supported",
                "save one plain float array per file");
  if (descr->kind != Value::Kind::text)
    throw Error(where, "descr is not a string", std::string(kRewrite));
  const auto type = type_of_descr(descr->text);
  if (!type)
    throw Error(where, fmt::format("element type '{}' is not supported", descr->text),
                fix_for_descr(descr->text));
  a.type = *type;
  if (fortran->kind != Value::Kind::boolean)
    throw Error(where, "fortran_order is not True or False", std::string(kRewrite));
  if (fortran->boolean)
    throw Error(where, "the array is stored in Fortran (column-major) order",
                "save a C-ordered copy: numpy.save(path, numpy.ascontiguousarray(a))");
  if (shape->kind != Value::Kind::tuple)
    throw Error(where, "shape is not a tuple of integers", std::string(kRewrite));
  a.shape = shape->dims;

  // Elements x item size, refusing products that overflow 64 bits.
  std::uint64_t need = npy_item_size(a.type);
  for (auto d : a.shape) {
    const auto du = static_cast<std::uint64_t>(d);
    if (du != 0 && need > std::numeric_limits<std::uint64_t>::max() / du)
      throw Error(where, fmt::format("shape {} is too large", shape_text(a.shape)),
                  "the header is corrupt; rewrite the file");
    need *= du;
  }
  for (auto d : a.shape)
    if (d == 0) need = 0;
  const std::uint64_t have = bytes.size() - header_start - header_len;
  if (have != need)
    throw Error(where,
                fmt::format("data holds {} bytes but shape {} of '{}' needs {}", have,
                            shape_text(a.shape), npy_descr(a.type), need),
                have < need ? "the file is truncated; write it again"
                            : "the header does not match the data; write the file again");
  const auto* data =
      reinterpret_cast<const std::uint8_t*>(bytes.data() + header_start + header_len);
  a.data.assign(data, data + have);
  return a;
}

NpyArray read_npy(const std::filesystem::path& file) {
  const std::string where = file.string();
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(where, "cannot open the .npy file", "check the path and its permissions");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw Error(where, "could not read the file", "check the path and the disk");
  return parse_npy(bytes, where);
}

namespace {
// Magic, version, header length and the header dict of `elements` values of `type` in `shape`,
// padded so that the data starts at a multiple of 64 bytes (as numpy.save does).
std::string npy_prefix(NpyType type, const std::vector<std::int64_t>& shape, std::size_t values,
                       int major) {
  std::uint64_t elements = 1;
  for (auto d : shape) elements *= static_cast<std::uint64_t>(d);
  if (elements != values)
    throw Error("write_npy",
                fmt::format("shape {} holds {} elements but {} values were given",
                            shape_text(shape), elements, values),
                "pass a shape whose product is the number of values");
  if (major < 1 || major > 3)
    throw Error("write_npy", fmt::format("format version {} does not exist", major),
                "use 1, 2 or 3");
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
                                   npy_descr(type), shape_text(shape));
  const std::size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::string out(kMagic);
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  for (std::size_t i = 0; i < prefix - 8; ++i)
    out.push_back(static_cast<char>((header.size() >> (8 * i)) & 0xff));
  return out + header;
}

void write_bytes(const std::filesystem::path& file, const std::string& bytes) {
  std::ofstream out(file, std::ios::binary);
  if (!out) throw Error(file.string(), "cannot create the file", "check that the folder exists");
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw Error(file.string(), "could not write the file", "check the free disk space");
}
}  // namespace

std::string encode_npy(NpyType type, const std::vector<std::int64_t>& shape,
                       const std::vector<float>& values, int major) {
  if (npy_is_integer(type)) {
    std::vector<std::int64_t> rounded(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) rounded[i] = std::llround(values[i]);
    return encode_npy_integers(type, shape, rounded, major);
  }
  std::string out = npy_prefix(type, shape, values.size(), major);
  for (float v : values) {
    std::uint8_t b[8];
    std::size_t n = 0;
    switch (type) {
      case NpyType::f32:
        std::memcpy(b, &v, 4);
        n = 4;
        break;
      case NpyType::f16:
      case NpyType::bf16: {
        const std::uint16_t h = type == NpyType::f16 ? float_to_f16(v) : float_to_bf16(v);
        b[0] = static_cast<std::uint8_t>(h & 0xff);
        b[1] = static_cast<std::uint8_t>(h >> 8);
        n = 2;
        break;
      }
      case NpyType::f64: {
        const double d = v;
        std::memcpy(b, &d, 8);
        n = 8;
        break;
      }
      case NpyType::i32:
      case NpyType::i64:
        break;  // handled above
    }
    out.append(reinterpret_cast<const char*>(b), n);
  }
  return out;
}

std::string encode_npy_integers(NpyType type, const std::vector<std::int64_t>& shape,
                                const std::vector<std::int64_t>& values, int major) {
  if (!npy_is_integer(type))
    throw Error("write_npy", fmt::format("'{}' is not an integer type", npy_descr(type)),
                "write integers as int32 or int64, floats with encode_npy");
  std::string out = npy_prefix(type, shape, values.size(), major);
  for (const std::int64_t v : values) {
    if (type == NpyType::i32) {
      if (v < std::numeric_limits<std::int32_t>::min() ||
          v > std::numeric_limits<std::int32_t>::max())
        throw Error("write_npy", fmt::format("{} does not fit int32", v), "write int64 instead");
      const auto narrow = static_cast<std::int32_t>(v);
      out.append(reinterpret_cast<const char*>(&narrow), 4);
    } else {
      out.append(reinterpret_cast<const char*>(&v), 8);
    }
  }
  return out;
}

void write_npy(const std::filesystem::path& file, NpyType type,
               const std::vector<std::int64_t>& shape, const std::vector<float>& values) {
  write_bytes(file, encode_npy(type, shape, values));
}

void write_npy_integers(const std::filesystem::path& file, NpyType type,
                        const std::vector<std::int64_t>& shape,
                        const std::vector<std::int64_t>& values) {
  write_bytes(file, encode_npy_integers(type, shape, values));
}

}  // namespace hisparse
