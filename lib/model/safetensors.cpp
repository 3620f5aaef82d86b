#include "model/safetensors.hpp"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.hpp"

namespace hisparse {
namespace {

constexpr std::uint64_t kMaxHeader = 100ull << 20;  // the format's own limit

std::string tensor_where(const std::filesystem::path& file, const std::string& name) {
  return fmt::format("{}: tensor {}", file.string(), name);
}

// A list as text for a message; nested values are elided (dumping a hostile, deeply nested
// header would recurse once per level).
std::string flat_text(const nlohmann::json& list) {
  std::string out = "[";
  for (const auto& v : list) {
    if (out.size() > 1) out += ",";
    out += v.is_primitive() ? v.dump() : (v.is_array() ? "[...]" : "{...}");
  }
  return out + "]";
}

}  // namespace

SafetensorsIndex read_safetensors_index(const std::filesystem::path& file) {
  const std::string where = file.string();
  std::ifstream in(file, std::ios::binary);
  if (!in) throw Error(where, "cannot open the safetensors file", "check the `weights:` path");
  std::error_code ec;
  const std::uint64_t size = std::filesystem::file_size(file, ec);
  if (ec || size < 8)
    throw Error(where, fmt::format("file of {} bytes is too short for a safetensors header", size),
                "the file is truncated or not a safetensors file");
  unsigned char len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxHeader || header_len > size - 8)
    throw Error(where,
                fmt::format("header length {} exceeds the file ({} bytes) or the 100 MiB limit",
                            header_len, size),
                "the file is truncated or not a safetensors file");
  std::string text(header_len, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_len));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(where, fmt::format("header is not valid JSON ({})", e.what()),
                "the file is corrupt or not a safetensors file");
  }
  if (!header.is_object())
    throw Error(where, "header is not a JSON object",
                "the file is corrupt or not a safetensors file");

  SafetensorsIndex index;
  index.file = file;
  index.data_start = 8 + header_len;
  const std::uint64_t data_size = size - index.data_start;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string at = tensor_where(file, name);
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets") || !entry["dtype"].is_string() ||
        !entry["shape"].is_array() || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2)
      throw Error(
          at,
          "entry needs \"dtype\" (string), \"shape\" (list) and \"data_offsets\" ([begin, end])",
          "rewrite the file with a safetensors writer");
    SafetensorsEntry t;
    t.name = name;
    t.dtype = parse_dtype(entry["dtype"].get<std::string>(), at);
    // Bytes the shape needs; a product past 2^64 cannot match any file, so it is refused before
    // it can wrap around to a small number that would.
    std::uint64_t need = size_of(t.dtype);
    bool too_large = false;
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_integer() || d.get<std::int64_t>() < 0)
        throw Error(at,
                    fmt::format("shape {} has a dimension that is not a non-negative integer",
                                flat_text(entry["shape"])),
                    "rewrite the file with a safetensors writer");
      t.shape.push_back(d.get<std::int64_t>());
      const auto du = static_cast<std::uint64_t>(t.shape.back());
      if (du != 0 && need > std::numeric_limits<std::uint64_t>::max() / du) too_large = true;
      need *= du;
    }
    if (std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end()) {
      need = 0;
      too_large = false;
    }
    if (too_large)
      throw Error(at, fmt::format("shape {} is too large for any file", entry["shape"].dump()),
                  "the header is corrupt; rewrite the file");
    const auto& off = entry["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      throw Error(at, "data_offsets must be two non-negative integers",
                  "rewrite the file with a safetensors writer");
    t.begin = off[0].get<std::uint64_t>();
    t.end = off[1].get<std::uint64_t>();
    if (t.end < t.begin || t.end > data_size)
      throw Error(at,
                  fmt::format("data_offsets [{}, {}] fall outside the data section of {} bytes",
                              t.begin, t.end, data_size),
                  "the file is truncated or its header is wrong");
    if (t.end - t.begin != need)
      throw Error(
          at,
          fmt::format("data_offsets [{}, {}] hold {} bytes but shape {} of {} needs {}", t.begin,
                      t.end, t.end - t.begin, entry["shape"].dump(), name_of(t.dtype), need),
          "the header does not match the data; rewrite the file");
    index.tensors.push_back(std::move(t));
  }
  std::sort(index.tensors.begin(), index.tensors.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.begin < b.begin; });
  // Sorted by begin: a tensor overlaps an earlier one exactly when it starts before the furthest
  // end seen so far (zero-byte tensors overlap nothing).
  const SafetensorsEntry* furthest = nullptr;
  for (const auto& cur : index.tensors) {
    if (cur.end == cur.begin) continue;
    if (furthest && cur.begin < furthest->end)
      throw Error(tensor_where(file, cur.name),
                  fmt::format("data_offsets [{}, {}] overlap tensor {} at [{}, {}]", cur.begin,
                              cur.end, furthest->name, furthest->begin, furthest->end),
                  "the header is corrupt; rewrite the file");
    if (!furthest || cur.end > furthest->end) furthest = &cur;
  }
  return index;
}

std::vector<std::uint8_t> read_safetensors_bytes(const SafetensorsIndex& index,
                                                 const SafetensorsEntry& entry) {
  std::ifstream in(index.file, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(index.data_start + entry.begin));
  std::vector<std::uint8_t> raw(entry.end - entry.begin);
  in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size()));
  if (!in)
    throw Error(tensor_where(index.file, entry.name), "could not read the tensor data",
                "the file is truncated or was changed while being read");
  return raw;
}

std::vector<float> read_safetensors_floats(const SafetensorsIndex& index,
                                           const SafetensorsEntry& entry) {
  const std::string at = tensor_where(index.file, entry.name);
  if (entry.dtype != DType::f32 && entry.dtype != DType::bf16 && entry.dtype != DType::f16 &&
      entry.dtype != DType::fp8_e4m3)
    throw Error(at,
                fmt::format("dtype {} is not a floating-point weight type", name_of(entry.dtype)),
                "store weights as F32, BF16, F16 or F8_E4M3");
  std::ifstream in(index.file, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(index.data_start + entry.begin));
  std::vector<unsigned char> raw(entry.end - entry.begin);
  in.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(raw.size()));
  if (!in) throw Error(at, "could not read the tensor data", "the file is truncated");
  const std::size_t n = raw.size() / size_of(entry.dtype);
  std::vector<float> out(n);
  for (std::size_t i = 0; i < n; ++i) {
    switch (entry.dtype) {
      case DType::f32:
        std::memcpy(&out[i], &raw[4 * i], 4);
        break;
      case DType::bf16:
        out[i] = bf16_to_float(static_cast<std::uint16_t>(raw[2 * i] | (raw[2 * i + 1] << 8)));
        break;
      case DType::f16:
        out[i] = f16_to_float(static_cast<std::uint16_t>(raw[2 * i] | (raw[2 * i + 1] << 8)));
        break;
      case DType::fp8_e4m3:
        out[i] = fp8e4m3_to_float(raw[i]);
        break;
      default:
        break;
    }
  }
  return out;
}

std::vector<std::uint8_t> encode_floats(const std::vector<float>& values, DType dtype) {
  std::vector<std::uint8_t> out(values.size() * size_of(dtype));
  for (std::size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::f32:
        std::memcpy(&out[4 * i], &values[i], 4);
        break;
      case DType::bf16:
      case DType::f16: {
        const std::uint16_t h =
            dtype == DType::bf16 ? float_to_bf16(values[i]) : float_to_f16(values[i]);
        out[2 * i] = static_cast<std::uint8_t>(h & 0xff);
        out[2 * i + 1] = static_cast<std::uint8_t>(h >> 8);
        break;
      }
      case DType::fp8_e4m3:
        out[i] = float_to_fp8e4m3(values[i]);
        break;
      default:
        throw Error("encode_floats", fmt::format("cannot encode floats as {}", name_of(dtype)),
                    "use f32, bf16, f16 or fp8_e4m3");
    }
  }
  return out;
}

void write_safetensors(const std::filesystem::path& file,
                       const std::vector<SafetensorsTensor>& tensors) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", std::string(name_of(t.dtype) == "f32"        ? "F32"
                                            : name_of(t.dtype) == "bf16"     ? "BF16"
                                            : name_of(t.dtype) == "f16"      ? "F16"
                                            : name_of(t.dtype) == "fp8_e4m3" ? "F8_E4M3"
                                            : name_of(t.dtype) == "i32"      ? "I32"
                                            : name_of(t.dtype) == "i64"      ? "I64"
                                                                             : "U8")},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');  // data section 8-byte aligned
  std::ofstream out(file, std::ios::binary);
  if (!out) throw Error(file.string(), "cannot create the file", "check that the folder exists");
  const std::uint64_t len = text.size();
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>((len >> (8 * i)) & 0xff));
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& t : tensors)
    out.write(reinterpret_cast<const char*>(t.bytes.data()),
              static_cast<std::streamsize>(t.bytes.size()));
}

}  // namespace hisparse
