#include "model/replay_capture.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <optional>

#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "core/memory.hpp"
#include "model/npy.hpp"
#include "model/safetensors.hpp"
#include "trace/nvtx.hpp"

namespace hisparse {
namespace fs = std::filesystem;

namespace {

enum class Element : std::uint8_t { f32, f16, bf16, f64, fp8_e4m3 };

std::size_t element_size(Element e) {
  switch (e) {
    case Element::f32:
      return 4;
    case Element::f16:
    case Element::bf16:
      return 2;
    case Element::f64:
      return 8;
    case Element::fp8_e4m3:
      return 1;
  }
  return 1;
}

// One loaded tensor, kept in its stored element type.
struct Slab {
  std::string source;  ///< "dir/k.npy" or "file.safetensors: tensor k"
  Element type = Element::f32;
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> bytes;

  [[nodiscard]] std::uint64_t elements() const { return bytes.size() / element_size(type); }
};

std::uint16_t half_at(const std::uint8_t* p, std::uint64_t i) {
  return static_cast<std::uint16_t>(p[2 * i] | (p[2 * i + 1] << 8));
}

// Elements [first, first + count) of the slab as float.
void decode(const Slab& s, std::uint64_t first, std::uint64_t count, float* out) {
  const std::uint8_t* p = s.bytes.data();
  switch (s.type) {
    case Element::f32:
      std::memcpy(out, p + 4 * first, 4 * count);
      break;
    case Element::f16:
      for (std::uint64_t i = 0; i < count; ++i) out[i] = f16_to_float(half_at(p, first + i));
      break;
    case Element::bf16:
      for (std::uint64_t i = 0; i < count; ++i) out[i] = bf16_to_float(half_at(p, first + i));
      break;
    case Element::f64:
      for (std::uint64_t i = 0; i < count; ++i) {
        double d;
        std::memcpy(&d, p + 8 * (first + i), 8);
        out[i] = static_cast<float>(d);
      }
      break;
    case Element::fp8_e4m3:
      for (std::uint64_t i = 0; i < count; ++i) out[i] = fp8e4m3_to_float(p[first + i]);
      break;
  }
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// The three captured roles and the layout of one layer of each.
enum class Role { k, q, v };
constexpr std::string_view role_name(Role r) {
  return r == Role::k ? "k" : r == Role::q ? "q" : "v";
}
constexpr std::string_view role_what(Role r) {
  return r == Role::k ? "keys" : r == Role::q ? "queries" : "values";
}
std::string role_layout(Role r) {
  return r == Role::q
             ? "[steps, q_heads, key_dim]"
             : fmt::format("[kv_heads, tokens, {}]", r == Role::k ? "key_dim" : "value_dim");
}

// A tensor found under the replay path, before loading.
struct Candidate {
  std::string source;
  std::uint64_t bytes = 0;
  std::function<Slab()> load;
};

// "k" -> (k, -1); "layers.12.q" -> (q, 12); anything else -> nullopt.
std::optional<std::pair<Role, int>> parse_name(std::string_view name) {
  int layer = -1;
  if (name.substr(0, 7) == "layers.") {
    name.remove_prefix(7);
    std::size_t digits = 0;
    long long v = 0;
    while (digits < name.size() && name[digits] >= '0' && name[digits] <= '9' && digits < 7)
      v = v * 10 + (name[digits++] - '0');
    if (digits == 0 || digits >= name.size() || name[digits] != '.') return std::nullopt;
    if (digits > 1 && name[0] == '0') return std::nullopt;  // "layers.01.k" is not a layer name
    layer = static_cast<int>(v);
    name.remove_prefix(digits + 1);
  }
  if (name == "k") return std::pair{Role::k, layer};
  if (name == "q") return std::pair{Role::q, layer};
  if (name == "v") return std::pair{Role::v, layer};
  return std::nullopt;
}

std::optional<Element> element_of(NpyType t) {
  switch (t) {
    case NpyType::f32:
      return Element::f32;
    case NpyType::f16:
      return Element::f16;
    case NpyType::bf16:
      return Element::bf16;
    case NpyType::f64:
      return Element::f64;
    case NpyType::i32:
    case NpyType::i64:
      return std::nullopt;
  }
  return std::nullopt;
}

std::optional<Element> element_of(DType t) {
  switch (t) {
    case DType::f32:
      return Element::f32;
    case DType::f16:
      return Element::f16;
    case DType::bf16:
      return Element::bf16;
    case DType::fp8_e4m3:
      return Element::fp8_e4m3;
    default:
      return std::nullopt;
  }
}

// Physical memory in bytes (0 when unknown); read directly, captures are loaded once per point.
std::size_t physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<std::size_t>(pages) * static_cast<std::size_t>(page)
                               : 0;
}

// One captured layer of a role: the slab that holds it and its first element there.
struct LayerRef {
  const Slab* slab = nullptr;
  std::uint64_t offset = 0;
};

}  // namespace

struct ReplayCapture::Data {
  ReplayGeometry geo;
  std::vector<std::unique_ptr<Slab>> slabs;
  std::vector<LayerRef> k, q, v;  ///< per captured layer
  std::int64_t tokens = 0, steps = 0;
  std::string key_source;
  std::vector<std::string> notes;

  // Splits each slab of a role into layers and checks every dimension against the model.
  // Returns the rows (tokens or steps) common to all layers.
  std::int64_t arrange(Role role, const std::map<int, Slab*>& found, std::vector<LayerRef>& out);
  [[nodiscard]] const LayerRef& layer_of(const std::vector<LayerRef>& refs, int layer) const {
    return refs[static_cast<std::size_t>(layer) % refs.size()];
  }
};

std::int64_t ReplayCapture::Data::arrange(Role role, const std::map<int, Slab*>& found,
                                          std::vector<LayerRef>& out) {
  const bool whole = found.count(-1) > 0;
  const int heads = role == Role::q ? geo.q_heads : geo.kv_heads;
  const int width = role == Role::v ? geo.value_dim : geo.key_dim;
  std::int64_t rows = -1;
  std::string rows_source;
  for (const auto& [layer, slab] : found) {
    const auto& sh = slab->shape;
    const std::string layout = role_layout(role);
    // Leading dimensions: [layers] for a whole tensor, an optional batch of 1 per layer.
    std::int64_t layers = 1;
    if (sh.size() == 4 && whole) {
      layers = sh[0];
    } else if (sh.size() == 4 && sh[0] != 1) {
      throw Error(slab->source,
                  fmt::format("shape {} has a leading batch dimension of {}; a per-layer tensor "
                              "is {} (or [1, ...])",
                              shape_text(sh), sh[0], layout),
                  "capture one sequence (batch index 0, e.g. t[0:1])");
    } else if (sh.size() != 3 && sh.size() != 4) {
      throw Error(slab->source,
                  fmt::format("shape {} has {} dimensions; {} {} are {} or [{}, {}", shape_text(sh),
                              sh.size(), whole ? "captured" : "per-layer", role_what(role), layout,
                              whole ? "layers" : "1", layout.substr(1)),
                  "reshape the capture as documented (workload.replay_path in the README)");
    }
    if (layers < 1)
      throw Error(slab->source, fmt::format("shape {} holds no layers", shape_text(sh)),
                  "capture at least one layer");
    const std::size_t o = sh.size() - 3;
    const std::int64_t n_rows = role == Role::q ? sh[o] : sh[o + 1];
    const std::int64_t n_heads = role == Role::q ? sh[o + 1] : sh[o];
    const std::int64_t n_width = sh[o + 2];
    const std::string read_as =
        fmt::format("shape {} read as {}{}", shape_text(sh),
                    sh.size() == 4 && whole ? "[layers, " : "[", layout.substr(1));
    if (n_heads != heads) {
      const bool query = role == Role::q;
      throw Error(
          slab->source,
          fmt::format("captured {} have {} {} heads but model {} has {} ({})", role_what(role),
                      n_heads, query ? "query" : "KV", geo.model_name, heads, read_as),
          query     ? "capture every query head of the model (MLA: the absorbed queries of every "
                      "attention head), or choose the model YAML the capture came from"
          : geo.mla ? "capture the MLA latent cache as one KV head, or choose the model "
                      "YAML the capture came from"
                    : "capture from a model with this many KV heads, or choose the "
                      "model YAML the capture came from");
    }
    if (n_width != width) {
      const std::string what =
          geo.mla ? (role == Role::v ? "kv_lora_rank" : "kv_lora_rank + qk_rope_head_dim")
                  : "head_dim";
      throw Error(slab->source,
                  fmt::format("captured {} have width {} but model {} has {} = {} ({})",
                              role_what(role), n_width, geo.model_name, what, width, read_as),
                  fmt::format("capture {} of a model with {} {}, or choose the model YAML the "
                              "capture came from",
                              role_what(role), what, width));
    }
    if (n_rows < 1)
      throw Error(slab->source,
                  fmt::format("captured {} hold no {} ({})", role_what(role),
                              role == Role::q ? "steps" : "tokens", read_as),
                  "capture at least one token and one decode step");
    if (rows >= 0 && n_rows != rows)
      throw Error(slab->source,
                  fmt::format("{} {} here but {} in {}", n_rows,
                              role == Role::q ? "steps" : "tokens", rows, rows_source),
                  "capture the same tokens and steps for every layer");
    rows = n_rows;
    rows_source = slab->source;
    const std::uint64_t per_layer = static_cast<std::uint64_t>(n_rows) * n_heads * n_width;
    for (std::int64_t l = 0; l < layers; ++l)
      out.push_back({slab, static_cast<std::uint64_t>(l) * per_layer});
  }
  return rows;
}

ReplayCapture::~ReplayCapture() = default;

ReplayCapture::ReplayCapture(const fs::path& path, const ReplayGeometry& geometry,
                             const std::string& setting)
    : d_(std::make_unique<Data>()) {
  HISPARSE_FUNC_RANGE();
  d_->geo = geometry;
  const std::string at = fmt::format("{}: {}", setting, path.string());
  std::error_code ec;
  if (path.empty())
    throw Error(setting, "generator 'replay' needs a path to captured tensors",
                fmt::format("set {} to a directory of .npy files or a .safetensors file", setting));
  if (!fs::exists(path, ec))
    throw Error(at, "does not exist",
                "point it at a directory holding k.npy and q.npy, or at a .safetensors file");

  // Find the candidate tensors.
  std::map<Role, std::map<int, Candidate>> found;
  std::vector<std::string> ignored;
  auto add = [&](std::string_view name, Candidate c) {
    const auto parsed = parse_name(name);
    if (!parsed) {
      ignored.emplace_back(name);
      return;
    }
    found[parsed->first][parsed->second] = std::move(c);
  };
  bool directory = false;
  if (fs::is_directory(path, ec)) {
    directory = true;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.is_regular_file(ec) && e.path().extension() == ".npy") files.push_back(e.path());
    if (ec)
      throw Error(at, fmt::format("cannot list the directory ({})", ec.message()),
                  "check its permissions");
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      Candidate c;
      c.source = f.string();
      c.bytes = fs::file_size(f, ec);
      c.load = [f] {
        NpyArray a = read_npy(f);
        const auto type = element_of(a.type);
        if (!type)
          throw Error(f.string(),
                      fmt::format("element type '{}' is an integer type, not a float type",
                                  npy_descr(a.type)),
                      "store captured keys, queries and values as float32 ('<f4'), float16 "
                      "('<f2'), float64 ('<f8') or bfloat16 bits as uint16 ('<u2')");
        Slab s;
        s.source = f.string();
        s.type = *type;
        s.shape = std::move(a.shape);
        s.bytes = std::move(a.data);
        return s;
      };
      add(f.stem().string(), std::move(c));
    }
  } else if (path.extension() == ".safetensors") {
    auto index = std::make_shared<SafetensorsIndex>(read_safetensors_index(path));
    for (const auto& e : index->tensors) {
      Candidate c;
      c.source = fmt::format("{}: tensor {}", path.string(), e.name);
      c.bytes = e.end - e.begin;
      c.load = [index, &e, source = c.source] {
        const auto type = element_of(e.dtype);
        if (!type)
          throw Error(source, fmt::format("dtype {} is not a float type", name_of(e.dtype)),
                      "store captured tensors as F32, BF16, F16 or F8_E4M3");
        Slab s;
        s.source = source;
        s.type = *type;
        s.shape = e.shape;
        s.bytes = read_safetensors_bytes(*index, e);
        return s;
      };
      add(e.name, std::move(c));
    }
  } else {
    throw Error(at, "is neither a directory nor a .safetensors file",
                "point it at a directory holding k.npy and q.npy, or at a .safetensors file "
                "with tensors k and q");
  }

  // Names: either one whole tensor or layers 0 .. n-1, never both; k and q required.
  for (Role r : {Role::k, Role::q, Role::v}) {
    auto it = found.find(r);
    if (it == found.end()) {
      if (r == Role::v) continue;
      throw Error(
          at, fmt::format("holds no captured {} ({})", role_what(r), role_name(r)),
          directory
              ? fmt::format("add {0}.npy (or layers.N.{0}.npy per layer)", role_name(r))
              : fmt::format("add a tensor \"{0}\" (or \"layers.N.{0}\" per layer)", role_name(r)));
    }
    const auto& layers = it->second;
    if (layers.count(-1) && layers.size() > 1)
      throw Error(at,
                  fmt::format("holds both a whole '{0}' and per-layer 'layers.N.{0}' {1}",
                              role_name(r), role_what(r)),
                  "keep one of the two forms");
    if (!layers.count(-1)) {
      int expect = 0;
      for (const auto& [l, c] : layers) {
        if (l != expect)
          throw Error(at,
                      fmt::format("per-layer {} skip layer {}: found layers.{}.{} but not "
                                  "layers.{}.{}",
                                  role_what(r), expect, l, role_name(r), expect, role_name(r)),
                      "capture layers 0, 1, 2, ... without gaps");
        ++expect;
      }
    }
  }
  if (geometry.mla && found.count(Role::v)) {
    d_->notes.push_back(
        "captured values (v) ignored: MLA values are the latent part of the captured keys");
    found.erase(Role::v);
  }

  // Refuse captures that cannot fit before reading them.
  std::uint64_t total = 0;
  for (const auto& [r, layers] : found)
    for (const auto& [l, c] : layers) total += c.bytes;
  const std::size_t ram = physical_memory();
  if (ram > 0 && total > ram / 2)
    throw Error(at,
                fmt::format("the captured tensors take {} but this host has {} of memory",
                            format_bytes(total), format_bytes(ram)),
                "capture fewer layers or tokens (one layer serves every model layer)");

  std::map<Role, std::map<int, Slab*>> loaded;
  for (auto& [r, layers] : found)
    for (auto& [l, c] : layers) {
      d_->slabs.push_back(std::make_unique<Slab>(c.load()));
      loaded[r][l] = d_->slabs.back().get();
    }

  d_->tokens = d_->arrange(Role::k, loaded[Role::k], d_->k);
  d_->steps = d_->arrange(Role::q, loaded[Role::q], d_->q);
  d_->key_source = d_->k.front().slab->source;
  if (loaded.count(Role::v)) {
    const std::int64_t v_tokens = d_->arrange(Role::v, loaded[Role::v], d_->v);
    if (v_tokens != d_->tokens)
      throw Error(d_->v.front().slab->source,
                  fmt::format("captured values hold {} tokens but the keys ({}) hold {}", v_tokens,
                              d_->key_source, d_->tokens),
                  "capture keys and values of the same tokens");
  }

  // Non-finite values would poison every score; name the first one.
  std::vector<float> chunk;
  for (const auto& s : d_->slabs) {
    const std::uint64_t n = s->elements();
    for (std::uint64_t first = 0; first < n; first += 1 << 16) {
      const std::uint64_t count = std::min<std::uint64_t>(n - first, 1 << 16);
      chunk.resize(count);
      decode(*s, first, count, chunk.data());
      for (std::uint64_t i = 0; i < count; ++i)
        if (!std::isfinite(chunk[i]))
          throw Error(s->source,
                      fmt::format("element {} (flat index) is {}", first + i,
                                  std::isnan(chunk[i]) ? "NaN" : "infinite"),
                      "capture finite values (a float16 overflow shows as inf; capture in "
                      "bfloat16 or float32)");
    }
  }

  auto layer_note = [&](Role r, const std::vector<LayerRef>& refs) {
    const auto n = static_cast<int>(refs.size());
    if (!geometry.describe_layer_reuse) return;
    if (n < geometry.layers)
      d_->notes.push_back(fmt::format(
          "captured {} have {} layer{} for the model's {}: model layer l replays captured layer "
          "l mod {}",
          role_what(r), n, n == 1 ? "" : "s", geometry.layers, n));
    else if (n > geometry.layers)
      d_->notes.push_back(
          fmt::format("the model's {} layers replay the first {} of {} captured "
                      "{} layers",
                      geometry.layers, geometry.layers, n, role_name(r)));
  };
  layer_note(Role::k, d_->k);
  layer_note(Role::q, d_->q);
  if (!d_->v.empty()) layer_note(Role::v, d_->v);
  if (!ignored.empty()) {
    const std::size_t shown = std::min<std::size_t>(ignored.size(), 5);
    d_->notes.push_back(
        fmt::format("ignored {} tensor{} that {} not k, q or v: {}{}", ignored.size(),
                    ignored.size() == 1 ? "" : "s", ignored.size() == 1 ? "is" : "are",
                    fmt::join(ignored.begin(), ignored.begin() + static_cast<long>(shown), ", "),
                    ignored.size() > shown ? ", ..." : ""));
  }
}

std::int64_t ReplayCapture::tokens() const noexcept {
  return d_->tokens;
}
std::int64_t ReplayCapture::steps() const noexcept {
  return d_->steps;
}
int ReplayCapture::key_layers() const noexcept {
  return static_cast<int>(d_->k.size());
}
int ReplayCapture::query_layers() const noexcept {
  return static_cast<int>(d_->q.size());
}
bool ReplayCapture::has_values() const noexcept {
  return !d_->v.empty();
}
const std::string& ReplayCapture::key_source() const noexcept {
  return d_->key_source;
}
const std::vector<std::string>& ReplayCapture::notes() const noexcept {
  return d_->notes;
}

namespace {
void check_range(const std::string& source, std::int64_t tokens, std::int64_t first,
                 std::int64_t count) {
  if (first < 0 || count < 0 || first + count > tokens)
    throw Error(source,
                fmt::format("tokens [{}, {}) were asked for but only {} are captured", first,
                            first + count, tokens),
                "lower context_length (and top_k) to at most the captured tokens, or capture "
                "more tokens");
}
}  // namespace

void ReplayCapture::keys(int layer, int kv_head, std::int64_t first, std::int64_t count,
                         float* out) const {
  check_range(d_->key_source, d_->tokens, first, count);
  const LayerRef& r = d_->layer_of(d_->k, layer);
  const auto dim = static_cast<std::uint64_t>(d_->geo.key_dim);
  decode(*r.slab, r.offset + (static_cast<std::uint64_t>(kv_head) * d_->tokens + first) * dim,
         static_cast<std::uint64_t>(count) * dim, out);
}

void ReplayCapture::values(int layer, int kv_head, std::int64_t first, std::int64_t count,
                           float* out) const {
  if (d_->v.empty())
    throw Error("ReplayCapture::values", "no values were captured",
                "check has_values() before asking");
  check_range(d_->v.front().slab->source, d_->tokens, first, count);
  const LayerRef& r = d_->layer_of(d_->v, layer);
  const auto dim = static_cast<std::uint64_t>(d_->geo.value_dim);
  decode(*r.slab, r.offset + (static_cast<std::uint64_t>(kv_head) * d_->tokens + first) * dim,
         static_cast<std::uint64_t>(count) * dim, out);
}

void ReplayCapture::queries(int layer, std::int64_t step, float* out) const {
  const LayerRef& r = d_->layer_of(d_->q, layer);
  const auto row = static_cast<std::uint64_t>(d_->geo.q_heads) * d_->geo.key_dim;
  const auto s = static_cast<std::uint64_t>(((step % d_->steps) + d_->steps) % d_->steps);
  decode(*r.slab, r.offset + s * row, row, out);
}

std::vector<float> ReplayCapture::key_variance(int layer, int kv_head, int skip_tokens) const {
  const std::int64_t first = d_->tokens - skip_tokens >= 2 ? skip_tokens : 0;
  const std::int64_t n = d_->tokens - first;
  const auto dim = static_cast<std::size_t>(d_->geo.key_dim);
  std::vector<float> row(dim);
  // Shifted sums (around the first row) keep the one-pass variance accurate for offset channels.
  std::vector<double> shift(dim), sum(dim, 0.0), sum_sq(dim, 0.0);
  for (std::int64_t t = first; t < d_->tokens; ++t) {
    keys(layer, kv_head, t, 1, row.data());
    for (std::size_t j = 0; j < dim; ++j) {
      if (t == first) shift[j] = row[j];
      const double x = row[j] - shift[j];
      sum[j] += x;
      sum_sq[j] += x * x;
    }
  }
  std::vector<float> var(dim);
  for (std::size_t j = 0; j < dim; ++j) {
    const double mean = sum[j] / static_cast<double>(n);
    var[j] = static_cast<float>(std::max(0.0, sum_sq[j] / static_cast<double>(n) - mean * mean));
  }
  return var;
}

}  // namespace hisparse
