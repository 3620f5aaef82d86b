// Parsers of user files (.npy, safetensors, model YAML, replay captures) under random input:
// valid files with random byte edits, and random YAML documents built from the model keys.
// Every case must either succeed or throw hisparse::Error; a crash or any other exception type
// fails. Seeds are fixed, so a failure names a case that can be replayed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <typeinfo>

#include <fmt/format.h>

#include "core/error.hpp"
#include "core/rng.hpp"
#include "model/decode_engine.hpp"
#include "model/kv_workload.hpp"
#include "model/model_spec.hpp"
#include "model/npy.hpp"
#include "model/safetensors.hpp"

namespace hisparse {
namespace {

namespace fs = std::filesystem;

std::string hex_prefix(const std::string& bytes) {
  std::string out;
  for (std::size_t i = 0; i < bytes.size() && i < 96; ++i)
    out += fmt::format("{:02x}", static_cast<unsigned char>(bytes[i]));
  return out + (bytes.size() > 96 ? "..." : "");
}

// Runs `f`; returns true when it succeeded, false when it threw hisparse::Error, and records a
// test failure (naming the case) for anything else.
bool error_or_success(const std::function<void()>& f, const std::string& what,
                      const std::string& input) {
  try {
    f();
    return true;
  } catch (const Error&) {
    return false;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": threw " << typeid(e).name() << " (" << e.what()
                  << ") instead of hisparse::Error; input " << hex_prefix(input);
  } catch (...) {
    ADD_FAILURE() << what << ": threw a non-std exception; input " << hex_prefix(input);
  }
  return false;
}

// Random edits of a valid file. Half of them land in the first `hot` bytes (headers), where
// they matter; the rest anywhere.
std::string mutate(const std::string& base, Rng& rng, std::size_t hot) {
  static const char kInteresting[] = {'\0', '\xff', '\x7f', '\x80', '0', '9', ' ', ',',
                                      '(',  ')',    '{',    '}',    '[', ']', ':', '\'',
                                      '"',  '\n',   '-',    '.',    'e', '#', '&', '*'};
  static const std::uint64_t kNumbers[] = {
      0, 1, 7, 0x7fffffff, 0xffffffff, 0x100000000ull, 1ull << 62, ~0ull >> 1, ~0ull};
  std::string s = base;
  const auto edits = 1 + rng.below(4);
  for (std::uint64_t e = 0; e < edits; ++e) {
    if (s.empty()) s.push_back('\0');
    const std::size_t span = rng.below(2) ? std::min(hot, s.size()) : s.size();
    const auto pos = static_cast<std::size_t>(rng.below(span));
    switch (rng.below(7)) {
      case 0:
        s[pos] = static_cast<char>(s[pos] ^ (1 << rng.below(8)));
        break;
      case 1:
        s[pos] = kInteresting[rng.below(sizeof(kInteresting))];
        break;
      case 2:
        s.erase(pos, 1 + rng.below(8));
        break;
      case 3:
        for (auto n = 1 + rng.below(8); n > 0; --n)
          s.insert(s.begin() + static_cast<long>(pos), static_cast<char>(rng.below(256)));
        break;
      case 4:
        s.resize(pos);
        break;
      case 5: {
        const auto from = static_cast<std::size_t>(rng.below(s.size()));
        s.insert(pos, s.substr(from, 1 + rng.below(16)));
        break;
      }
      default: {
        const std::uint64_t v = kNumbers[rng.below(std::size(kNumbers))];
        for (std::size_t i = 0; i < 8 && pos + i < s.size(); ++i)
          s[pos + i] = static_cast<char>((v >> (8 * i)) & 0xff);
        break;
      }
    }
  }
  return s;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_all(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

fs::path fuzz_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("hisparse_model_parsers_fuzz_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<float> ramp(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(i % 17) * 0.5f - 4.0f;
  return v;
}

TEST(ModelParsersFuzz, MutatedNpyFilesGiveErrorOrAConsistentArray) {
  std::vector<std::string> seeds;
  for (NpyType t : {NpyType::f32, NpyType::f16, NpyType::bf16, NpyType::f64})
    for (int major : {1, 2, 3}) seeds.push_back(encode_npy(t, {2, 3, 2}, ramp(12), major));
  Rng rng(0x4e5059);
  int ok = 0;
  for (int i = 0; i < 4000; ++i) {
    const std::string input = mutate(seeds[rng.below(seeds.size())], rng, 80);
    ok += error_or_success(
        [&] {
          const NpyArray a = parse_npy(input, "fuzz.npy");
          // Success must mean a self-consistent array.
          ASSERT_EQ(a.data.size(), a.elements() * npy_item_size(a.type)) << hex_prefix(input);
          ASSERT_EQ(a.floats().size(), a.elements());
        },
        fmt::format("npy case {}", i), input);
  }
  EXPECT_GT(ok, 20);  // some mutations leave a valid file (data bytes, spacing)
  EXPECT_LT(ok, 4000);
}

TEST(ModelParsersFuzz, MutatedSafetensorsGiveErrorOrReadableTensors) {
  const fs::path dir = fuzz_dir("safetensors");
  const fs::path seed_file = dir / "seed.safetensors";
  write_safetensors(seed_file,
                    {{"k", DType::bf16, {2, 3}, encode_floats(ramp(6), DType::bf16)},
                     {"q", DType::f32, {4}, encode_floats(ramp(4), DType::f32)},
                     {"s", DType::fp8_e4m3, {3}, encode_floats(ramp(3), DType::fp8_e4m3)},
                     {"i", DType::i32, {1}, std::vector<std::uint8_t>(4)}});
  const std::string seed = read_all(seed_file);
  const fs::path file = dir / "case.safetensors";
  Rng rng(0x5afe);
  int ok = 0;
  for (int i = 0; i < 1500; ++i) {
    const std::string input = mutate(seed, rng, seed.size() - 40);
    write_all(file, input);
    ok += error_or_success(
        [&] {
          const SafetensorsIndex index = read_safetensors_index(file);
          for (const auto& t : index.tensors) {
            ASSERT_LE(index.data_start + t.end, input.size());
            ASSERT_EQ(read_safetensors_bytes(index, t).size(), t.end - t.begin);
            if (t.dtype != DType::i32 && t.dtype != DType::i64 && t.dtype != DType::u8)
              (void)read_safetensors_floats(index, t);
          }
        },
        fmt::format("safetensors case {}", i), input);
  }
  EXPECT_GT(ok, 10);
  // Hostile headers: deep nesting as the shape and as the whole header (errors), and under a key
  // the reader ignores (a valid file).
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  const std::pair<std::string, bool> hostile[] = {
      {R"({"k": {"dtype": "F32", "shape": )" + deep + R"(, "data_offsets": [0, 0]}})", false},
      {deep, false},
      {R"({"k": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4], "x": )" + deep + "}}",
       true}};
  for (const auto& [header, valid] : hostile) {
    std::string bytes(8, '\0');
    for (std::size_t i = 0; i < 8; ++i)
      bytes[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
    bytes += header + std::string(4, '\0');
    write_all(file, bytes);
    EXPECT_EQ(error_or_success([&] { (void)read_safetensors_index(file); }, "deep header",
                               bytes.substr(0, 200)),
              valid);
  }
  fs::remove_all(dir);
}

// A random YAML value: scalars of every awkward kind, lists and nested mappings.
std::string random_value(Rng& rng, int depth) {
  static const char* kScalars[] = {
      "0",        "1",     "-1",         "2",           "4",
      "64",       "128",   "2147483647", "2147483648",  "9223372036854775808",
      "1e400",    "-0.0",  "nan",        ".inf",        "3.5",
      "abc",      "true",  "false",      "null",        "~",
      "''",       "\"x\"", "mla",        "gqa",         "dense",
      "moe",      "bf16",  "fp8_e4m3",   "mla_fp8_656", "gqa_bf16",
      "mla_bf16", "0x10",  "1_000"};
  const auto pick = rng.below(depth > 2 ? 1 : 4);
  if (pick == 1) {
    std::string s = "[";
    for (auto n = rng.below(4); n > 0; --n) s += random_value(rng, depth + 1) + ", ";
    return s + "]";
  }
  if (pick == 2) {
    std::string s = "{";
    for (auto n = rng.below(4); n > 0; --n)
      s += fmt::format("k{}: {}, ", rng.below(5), random_value(rng, depth + 1));
    return s + "}";
  }
  return kScalars[rng.below(std::size(kScalars))];
}

std::string random_model_yaml(Rng& rng) {
  static const char* kTop[] = {"name",         "layers",     "hidden",   "vocab",       "kv_layout",
                               "weight_dtype", "rope_theta", "norm_eps", "weight_seed", "bogus"};
  static const char* kAttention[] = {"kind",
                                     "heads",
                                     "q_lora_rank",
                                     "kv_lora_rank",
                                     "qk_nope_head_dim",
                                     "qk_rope_head_dim",
                                     "v_head_dim",
                                     "q_heads",
                                     "kv_heads",
                                     "head_dim",
                                     "qk_norm"};
  static const char* kFfn[] = {"kind",           "dense_width",  "first_dense_layers",
                               "experts",        "experts_held", "active_experts",
                               "shared_experts", "expert_width"};
  static const char* kIndexer[] = {"heads", "head_dim", "top_k", "every_n_layers"};
  std::string y;
  for (const char* k : kTop)
    if (rng.below(4)) y += fmt::format("{}: {}\n", k, random_value(rng, 0));
  auto section = [&](const char* name, const char* const* keys, std::size_t n) {
    if (!rng.below(8)) return;
    y += fmt::format("{}:\n", name);
    for (std::size_t i = 0; i < n; ++i)
      if (rng.below(3)) y += fmt::format("  {}: {}\n", keys[i], random_value(rng, 0));
  };
  section("attention", kAttention, std::size(kAttention));
  section("ffn", kFfn, std::size(kFfn));
  if (rng.below(2)) section("indexer", kIndexer, std::size(kIndexer));
  return y;
}

TEST(ModelParsersFuzz, MutatedAndRandomModelYamlGiveErrorOrAValidModel) {
  std::vector<std::string> seeds;
  for (const auto& name : list_model_presets())
    seeds.push_back(read_all(model_presets_dir() / (name + ".yaml")));
  ASSERT_GE(seeds.size(), 2u);
  Rng rng(0x9a31);
  int ok = 0;
  auto check = [&](const std::string& text, const std::string& what) {
    ok += error_or_success(
        [&] {
          const ModelSpec m = parse_model_yaml(text, "fuzz.yaml");
          ASSERT_GT(m.layers, 0);
          ASSERT_GT(m.hidden, 0);
          ASSERT_GT(m.kv_row_bytes(), 0u);
          if (m.is_mla()) {
            ASSERT_GT(m.mla.kv_lora_rank, 0);
          } else {
            ASSERT_EQ(m.gqa.q_heads % m.gqa.kv_heads, 0);
          }
        },
        what, text);
  };
  for (int i = 0; i < 1500; ++i)
    check(mutate(seeds[rng.below(seeds.size())], rng, 4096), fmt::format("yaml mutation {}", i));
  for (int i = 0; i < 1500; ++i) check(random_model_yaml(rng), fmt::format("random yaml {}", i));
  // Deep nesting and odd documents.
  check(std::string(5000, '[') + std::string(5000, ']'), "deep list");
  check("layers: &a [*a]\n", "self alias");
  check("---\n...\n---\nlayers: 1\n", "several documents");
  check(std::string("layers: 1\0hidden: 2", 19), "NUL byte");
  EXPECT_GT(ok, 0);  // some mutated presets still parse (comments, spacing)
}

// The replay loader end to end: a valid tiny-gqa capture with one file mutated per case.
TEST(ModelParsersFuzz, MutatedReplayCapturesGiveErrorOrServableData) {
  const fs::path dir = fuzz_dir("replay");
  const ModelSpec model = load_model("tiny-gqa");
  const std::string k = encode_npy(NpyType::bf16, {2, 20, 32}, ramp(2 * 20 * 32));
  const std::string q = encode_npy(NpyType::f32, {3, 8, 32}, ramp(3 * 8 * 32));
  const std::string v = encode_npy(NpyType::f16, {1, 2, 20, 32}, ramp(2 * 20 * 32));
  const fs::path st = dir / "capture.safetensors";
  write_safetensors(
      st, {{"layers.0.k", DType::bf16, {2, 20, 32}, encode_floats(ramp(2 * 20 * 32), DType::bf16)},
           {"layers.0.q", DType::f32, {3, 8, 32}, encode_floats(ramp(3 * 8 * 32), DType::f32)}});
  const std::string st_seed = read_all(st);
  WorkloadSpec spec;
  spec.generator = "replay";
  Rng rng(0x7e91a7);
  int ok = 0;
  auto exercise = [&](const WorkloadSpec& s) {
    const KvWorkload w(model, s, 1, 16);
    std::vector<float> buf(20 * 32 * 8);
    w.keys(0, 1, 1, 0, 16, buf.data());
    w.values(0, 0, 0, 4, 12, buf.data());
    w.queries(0, 1, 7, buf.data());
    (void)w.channel_variance(1, 0);
    (void)w.select(0, 0, 0, 16, 4);
  };
  for (int i = 0; i < 400; ++i) {
    const int target = static_cast<int>(rng.below(4));
    std::string input;
    if (target < 3) {
      input = mutate(target == 0 ? k : target == 1 ? q : v, rng, 80);
      write_all(dir / "k.npy", target == 0 ? input : k);
      write_all(dir / "q.npy", target == 1 ? input : q);
      write_all(dir / "v.npy", target == 2 ? input : v);
      spec.replay_path = dir.string();
    } else {
      input = mutate(st_seed, rng, 256);
      write_all(st, input);
      spec.replay_path = st.string();
    }
    ok += error_or_success([&] { exercise(spec); }, fmt::format("replay case {}", i), input);
  }
  EXPECT_GT(ok, 20);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace hisparse
