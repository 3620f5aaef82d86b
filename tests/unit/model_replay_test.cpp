// KvWorkload's "replay" generator: small captured tensors with known values written to a temp
// dir (.npy files and safetensors), served back exactly, and one clear Error per mismatch.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <string>

#include <fmt/format.h>

#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "fathom/quality_study.hpp"
#include "model/decode_engine.hpp"
#include "model/kv_workload.hpp"
#include "model/npy.hpp"
#include "model/replay_capture.hpp"
#include "model/replay_study.hpp"
#include "model/safetensors.hpp"
#include "model/synthetic_capture.hpp"
#include "support/error_message.hpp"
#include "support/run_command.hpp"
#include "support/temp_dir.hpp"

namespace hisparse {
namespace {

namespace fs = std::filesystem;
using Shape = std::vector<std::int64_t>;

// tiny-gqa: 2 layers, 2 KV heads, 8 query heads, head_dim 32. tiny-dsa: 3 layers, one latent
// "KV head" of width 64 + 16, 4 query heads.
constexpr int kDim = 32, kKv = 2, kQ = 8, kTokens = 64, kSteps = 3;

// Known values, exact in bf16 (small integers): distinct per layer, head, token and channel.
float key_value(std::int64_t l, std::int64_t g, std::int64_t t, std::int64_t j) {
  return static_cast<float>((l * 37 + g * 11 + t * 5 + j * 3) % 61 - 30);
}
float value_value(std::int64_t l, std::int64_t g, std::int64_t t, std::int64_t j) {
  return static_cast<float>((l * 13 + g * 7 + t * 3 + j) % 41 - 20) * 0.5f;
}
float query_value(std::int64_t l, std::int64_t s, std::int64_t h, std::int64_t j) {
  return static_cast<float>((l * 29 + s * 17 + h * 5 + j) % 23 - 11) * 0.25f;
}

// Fills a row-major tensor of `shape` whose last four dimensions (or three, with a leading
// index `lead`) are passed to `f` as (lead, a, b, c).
std::vector<float> fill(
    const Shape& shape,
    const std::function<float(std::int64_t, std::int64_t, std::int64_t, std::int64_t)>& f,
    std::int64_t lead = 0) {
  const bool four = shape.size() == 4;
  const std::int64_t n0 = four ? shape[0] : 1, n1 = shape[shape.size() - 3],
                     n2 = shape[shape.size() - 2], n3 = shape.back();
  std::vector<float> out;
  for (std::int64_t a = 0; a < n0; ++a)
    for (std::int64_t b = 0; b < n1; ++b)
      for (std::int64_t c = 0; c < n2; ++c)
        for (std::int64_t d = 0; d < n3; ++d) out.push_back(f(four ? a : lead, b, c, d));
  return out;
}

class ReplayDir {
 public:
  explicit ReplayDir(const std::string& name)
      : dir_(fs::temp_directory_path() / ("hisparse_model_replay_test_" + name)) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~ReplayDir() { fs::remove_all(dir_); }
  [[nodiscard]] const fs::path& path() const { return dir_; }
  [[nodiscard]] std::string file(const std::string& name) const { return (dir_ / name).string(); }
  void npy(const std::string& name, const Shape& shape, const std::vector<float>& v,
           NpyType type = NpyType::f32) const {
    write_npy(dir_ / name, type, shape, v);
  }

 private:
  fs::path dir_;
};

WorkloadSpec replay_of(const fs::path& path) {
  WorkloadSpec s;
  s.generator = "replay";
  s.replay_path = path.string();
  return s;
}

// The standard tiny-gqa capture: k, q and (optionally) v with a layer dimension.
void write_gqa_capture(const ReplayDir& d, bool with_values, NpyType type = NpyType::f32) {
  const Shape ks{2, kKv, kTokens, kDim}, qs{2, kSteps, kQ, kDim};
  d.npy("k.npy", ks, fill(ks, key_value), type);
  d.npy("q.npy", qs, fill(qs, query_value), type);
  if (with_values) d.npy("v.npy", ks, fill(ks, value_value), type);
}

std::string error_of(const std::string& model, const WorkloadSpec& spec,
                     std::int64_t context = 48) {
  try {
    KvWorkload w(load_model(model), spec, 1, context);
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

TEST(ModelReplay, DirectoryOfNpyServesCapturedKeysValuesAndQueriesExactly) {
  const ReplayDir d("npy");
  write_gqa_capture(d, true, NpyType::bf16);
  const KvWorkload w(load_model("tiny-gqa"), replay_of(d.path()), 2, 48);
  EXPECT_TRUE(w.replay());
  EXPECT_TRUE(w.notes().empty());
  ASSERT_NE(w.capture(), nullptr);
  EXPECT_EQ(w.capture()->tokens(), kTokens);
  EXPECT_EQ(w.capture()->steps(), kSteps);
  std::vector<float> k(5 * kDim), v(5 * kDim), q(kQ * kDim);
  for (int request : {0, 1}) {  // every request replays the same sequence
    w.keys(request, 1, 1, 10, 5, k.data());
    w.values(request, 0, 1, 40, 5, v.data());
    for (int t = 0; t < 5; ++t)
      for (int j = 0; j < kDim; ++j) {
        ASSERT_EQ(k[static_cast<std::size_t>(t * kDim + j)], key_value(1, 1, 10 + t, j));
        ASSERT_EQ(v[static_cast<std::size_t>(t * kDim + j)], value_value(0, 1, 40 + t, j));
      }
  }
  // Tokens past the context but inside the capture are served too (select() looks ahead).
  w.keys(0, 0, 0, kTokens - 1, 1, k.data());
  EXPECT_EQ(k[3], key_value(0, 0, kTokens - 1, 3));
  // Step 4 replays captured step 4 mod 3 = 1.
  w.queries(1, 1, 4, q.data());
  for (int h = 0; h < kQ; ++h)
    for (int j = 0; j < kDim; ++j)
      ASSERT_EQ(q[static_cast<std::size_t>(h * kDim + j)], query_value(1, 1, h, j));
}

TEST(ModelReplay, PerLayerSafetensorsWithBatchDimAndSyntheticValues) {
  const ReplayDir d("safetensors");
  const Shape k0{1, kKv, kTokens, kDim}, k1{kKv, kTokens, kDim}, qs{kSteps, kQ, kDim};
  const auto tensor = [](const std::string& name, DType t, const Shape& s,
                         const std::vector<float>& v) {
    return SafetensorsTensor{name, t, s, encode_floats(v, t)};
  };
  const fs::path file = d.path() / "capture.safetensors";
  write_safetensors(file, {tensor("layers.0.k", DType::bf16, k0, fill(k0, key_value, 0)),
                           tensor("layers.1.k", DType::f16, k1, fill(k1, key_value, 1)),
                           tensor("layers.0.q", DType::f32, qs, fill(qs, query_value, 0)),
                           tensor("layers.1.q", DType::f32, qs, fill(qs, query_value, 1)),
                           tensor("lm_head", DType::f32, {2}, {1, 2})});
  const KvWorkload w(load_model("tiny-gqa"), replay_of(file), 1, 64);
  std::vector<float> k(kTokens * kDim);
  w.keys(0, 1, 0, 0, kTokens, k.data());
  for (int t = 0; t < kTokens; ++t)
    for (int j = 0; j < kDim; ++j)
      ASSERT_EQ(k[static_cast<std::size_t>(t * kDim + j)], key_value(1, 0, t, j));
  std::vector<float> q(kQ * kDim);
  w.queries(0, 0, 2, q.data());
  EXPECT_EQ(q[kDim + 5], query_value(0, 2, 1, 5));
  // No v: the synthetic workload's values, and notes that say so.
  const KvWorkload synthetic(load_model("tiny-gqa"), WorkloadSpec{}, 1, 64);
  std::vector<float> v(8 * kDim), v_synthetic(8 * kDim);
  w.values(0, 1, 1, 3, 8, v.data());
  synthetic.values(0, 1, 1, 3, 8, v_synthetic.data());
  EXPECT_EQ(v, v_synthetic);
  EXPECT_EQ(w.notes(),
            (std::vector<std::string>{"ignored 1 tensor that is not k, q or v: lm_head",
                                      "no values (v) captured: values are synthetic N(0, 1)"}));
}

TEST(ModelReplay, OneCapturedLayerServesEveryLayer) {
  const ReplayDir d("one_layer");
  const Shape ks{kKv, kTokens, kDim}, qs{kSteps, kQ, kDim};
  d.npy("k.npy", ks, fill(ks, key_value));
  d.npy("q.npy", qs, fill(qs, query_value), NpyType::f64);
  d.npy("notes.npy", {1}, {0});  // an unrelated file: ignored
  const KvWorkload w(load_model("tiny-gqa"), replay_of(d.path()), 1, 64);
  std::vector<float> k0(kTokens * kDim), k1(kTokens * kDim);
  w.keys(0, 0, 1, 0, kTokens, k0.data());
  w.keys(0, 1, 1, 0, kTokens, k1.data());
  EXPECT_EQ(k0, k1);
  EXPECT_EQ(k1[7], key_value(0, 1, 0, 7));
  EXPECT_EQ(w.capture()->key_layers(), 1);
  EXPECT_EQ(w.notes(),
            (std::vector<std::string>{
                "captured keys have 1 layer for the model's 2: model layer l replays captured "
                "layer l mod 1",
                "captured queries have 1 layer for the model's 2: model layer l replays "
                "captured layer l mod 1",
                "ignored 1 tensor that is not k, q or v: notes",
                "no values (v) captured: values are synthetic N(0, 1)"}));
}

TEST(ModelReplay, CalibrationVarianceComesFromCapturedKeysAfterTheFirst16Tokens) {
  const ReplayDir d("variance");
  // Tokens 0..15 are huge (sinks): skipped. After them, channel j alternates +-(j + 1) around
  // an offset of 100, so its variance is exactly (j + 1)^2.
  const Shape ks{kKv, kTokens, kDim}, qs{1, kQ, kDim};
  d.npy("k.npy", ks, fill(ks, [](auto, auto, auto t, auto j) {
          return t < 16 ? 1000.0f : 100.0f + static_cast<float>((t % 2 ? 1 : -1) * (j + 1));
        }));
  d.npy("q.npy", qs, fill(qs, query_value));
  const KvWorkload w(load_model("tiny-gqa"), replay_of(d.path()), 1, 64);
  for (int g = 0; g < kKv; ++g) {
    const auto var = w.channel_variance(1, g);
    ASSERT_EQ(var.size(), static_cast<std::size_t>(kDim));
    for (int j = 0; j < kDim; ++j)
      EXPECT_FLOAT_EQ(var[static_cast<std::size_t>(j)], static_cast<float>((j + 1) * (j + 1)));
  }
}

TEST(ModelReplay, MlaValuesAreTheLatentKeysAndTheIndexerReadsCapturedChannels) {
  const ReplayDir d("mla");
  constexpr int kWidth = 64 + 16, kHeads = 4;
  const Shape ks{3, 1, 96, kWidth}, qs{3, 2, kHeads, kWidth};
  d.npy("k.npy", ks, fill(ks, key_value));
  d.npy("q.npy", qs, fill(qs, query_value));
  d.npy("v.npy", {3, 1, 96, 64}, std::vector<float>(3 * 96 * 64, 1.0f));
  const KvWorkload w(load_model("tiny-dsa"), replay_of(d.path()), 1, 96);
  EXPECT_EQ(w.notes(), (std::vector<std::string>{
                           "captured values (v) ignored: MLA values are the latent part of the "
                           "captured keys",
                           "DSA index keys and queries are channels of the captured keys and "
                           "queries"}));
  std::vector<float> k(4 * kWidth), v(4 * 64), ix(4 * 32);
  w.keys(0, 2, 0, 50, 4, k.data());
  w.values(0, 2, 0, 50, 4, v.data());
  w.index_keys(0, 2, 50, 4, ix.data());
  for (int t = 0; t < 4; ++t) {
    for (int j = 0; j < 64; ++j) {
      ASSERT_EQ(k[static_cast<std::size_t>(t * kWidth + j)], key_value(2, 0, 50 + t, j));
      ASSERT_EQ(v[static_cast<std::size_t>(t * 64 + j)], key_value(2, 0, 50 + t, j));
    }
    // Every index channel is one of the key's channels.
    for (int c = 0; c < 32; ++c) {
      const float x = ix[static_cast<std::size_t>(t * 32 + c)];
      EXPECT_NE(std::find(k.begin() + t * kWidth, k.begin() + (t + 1) * kWidth, x),
                k.begin() + (t + 1) * kWidth);
    }
  }
  const auto picked = w.select(0, 1, 0, 96, 16);
  EXPECT_EQ(picked.size(), 16u);
  EXPECT_TRUE(std::is_sorted(picked.begin(), picked.end()));
  EXPECT_GE(picked.front(), 0);
  // Looking beyond the captured tokens is an error that names both numbers.
  EXPECT_THROW((void)w.select(0, 1, 0, 97, 16), Error);
}

TEST(ModelReplay, ContextLongerThanTheCaptureNamesBothNumbersAndTheFix) {
  const ReplayDir d("context");
  write_gqa_capture(d, false);
  EXPECT_EQ(error_of("tiny-gqa", replay_of(d.path()), 100),
            "workload.replay_path: " + d.file("k.npy") +
                ": context_length 100 is longer than the 64 captured tokens; lower "
                "context_length to at most 64 or capture more tokens");
  const KvWorkload w(load_model("tiny-gqa"), replay_of(d.path()), 1, 64);
  std::vector<float> k(2 * kDim);
  try {
    w.keys(0, 0, 0, 63, 2, k.data());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              d.file("k.npy") +
                  ": tokens [63, 65) were asked for but only 64 are captured; lower "
                  "context_length (and top_k) to at most the captured tokens, or capture more "
                  "tokens");
  }
}

TEST(ModelReplay, ShapesThatDoNotMatchTheModelAreRejected) {
  const ReplayDir d("shapes");
  const Shape qs{kSteps, kQ, kDim};
  d.npy("q.npy", qs, fill(qs, query_value));
  d.npy("k.npy", {kKv, kTokens, 16}, std::vector<float>(kKv * kTokens * 16));
  EXPECT_EQ(error_of("tiny-gqa", replay_of(d.path())),
            d.file("k.npy") +
                ": captured keys have width 16 but model tiny-gqa has head_dim = 32 (shape [2, "
                "64, 16] read as [kv_heads, tokens, key_dim]); capture keys of a model with "
                "head_dim 32, or choose the model YAML the capture came from");
  d.npy("k.npy", {2, 4, kTokens, kDim}, std::vector<float>(2 * 4 * kTokens * kDim));
  EXPECT_EQ(error_of("tiny-gqa", replay_of(d.path())),
            d.file("k.npy") +
                ": captured keys have 4 KV heads but model tiny-gqa has 2 (shape [2, 4, 64, 32] "
                "read as [layers, kv_heads, tokens, key_dim]); capture from a model with this "
                "many KV heads, or choose the model YAML the capture came from");
  d.npy("k.npy", {kKv, kTokens, kDim}, std::vector<float>(kKv * kTokens * kDim));
  d.npy("q.npy", {kSteps, 4, kDim}, std::vector<float>(kSteps * 4 * kDim));
  EXPECT_EQ(error_of("tiny-gqa", replay_of(d.path())),
            d.file("q.npy") +
                ": captured queries have 4 query heads but model tiny-gqa has 8 (shape [3, 4, "
                "32] read as [steps, q_heads, key_dim]); capture every query head of the model "
                "(MLA: the absorbed queries of every attention head), or choose the model YAML "
                "the capture came from");
  d.npy("q.npy", {kQ, kDim}, std::vector<float>(kQ * kDim));
  EXPECT_EQ(error_of("tiny-gqa", replay_of(d.path())),
            d.file("q.npy") +
                ": shape [8, 32] has 2 dimensions; captured queries are [steps, q_heads, "
                "key_dim] or [layers, steps, q_heads, key_dim]; reshape the capture as "
                "documented (workload.replay_path in the README)");
  d.npy("q.npy", qs, fill(qs, query_value));
  d.npy("v.npy", {kKv, 32, kDim}, std::vector<float>(kKv * 32 * kDim));
  EXPECT_EQ(error_of("tiny-gqa", replay_of(d.path())),
            d.file("v.npy") + ": captured values hold 32 tokens but the keys (" + d.file("k.npy") +
                ") hold 64; capture keys and values of the same tokens");
  fs::remove(d.path() / "v.npy");
  // Integer arrays are .npy files this reader parses (selection dumps) but never keys.
  write_npy_integers(d.path() / "k.npy", NpyType::i32, {kKv, kTokens, kDim},
                     std::vector<std::int64_t>(kKv * kTokens * kDim, 1));
  EXPECT_EQ(error_of("tiny-gqa", replay_of(d.path())),
            d.file("k.npy") +
                ": element type '<i4' is an integer type, not a float type; store captured "
                "keys, queries and values as float32 ('<f4'), float16 ('<f2'), float64 ('<f8') "
                "or bfloat16 bits as uint16 ('<u2')");
  // MLA: the key row must be latent + rope wide.
  d.npy("k.npy", {1, kTokens, 64}, std::vector<float>(kTokens * 64));
  EXPECT_EQ(error_of("tiny-dsa", replay_of(d.path())),
            d.file("k.npy") +
                ": captured keys have width 64 but model tiny-dsa has kv_lora_rank + "
                "qk_rope_head_dim = 80 (shape [1, 64, 64] read as [kv_heads, tokens, key_dim]); "
                "capture keys of a model with kv_lora_rank + qk_rope_head_dim 80, or choose the "
                "model YAML the capture came from");
}

TEST(ModelReplay, MissingAndMisnamedTensorsAreRejected) {
  const ReplayDir d("names");
  const Shape ks{kKv, kTokens, kDim}, qs{kSteps, kQ, kDim};
  const std::string at = "workload.replay_path: " + d.path().string();
  d.npy("k.npy", ks, fill(ks, key_value));
  EXPECT_EQ(error_of("tiny-gqa", replay_of(d.path())),
            at + ": holds no captured queries (q); add q.npy (or layers.N.q.npy per layer)");
  d.npy("layers.0.q.npy", qs, fill(qs, query_value));
  d.npy("layers.2.q.npy", qs, fill(qs, query_value));
  EXPECT_EQ(error_of("tiny-gqa", replay_of(d.path())),
            at + ": per-layer queries skip layer 1: found layers.2.q but not layers.1.q; capture "
                 "layers 0, 1, 2, ... without gaps");
  fs::remove(d.path() / "layers.2.q.npy");
  d.npy("layers.0.k.npy", ks, fill(ks, key_value));
  EXPECT_EQ(error_of("tiny-gqa", replay_of(d.path())),
            at + ": holds both a whole 'k' and per-layer 'layers.N.k' keys; keep one of the two "
                 "forms");
  fs::remove(d.path() / "layers.0.k.npy");
  d.npy("layers.1.q.npy", {5, kQ, kDim}, std::vector<float>(5 * kQ * kDim));
  EXPECT_EQ(error_of("tiny-gqa", replay_of(d.path())),
            d.file("layers.1.q.npy") + ": 5 steps here but 3 in " + d.file("layers.0.q.npy") +
                "; capture the same tokens and steps for every layer");
  d.npy("layers.1.q.npy", {2, kSteps, kQ, kDim}, std::vector<float>(2 * kSteps * kQ * kDim));
  EXPECT_EQ(error_of("tiny-gqa", replay_of(d.path())),
            d.file("layers.1.q.npy") +
                ": shape [2, 3, 8, 32] has a leading batch dimension of 2; a per-layer tensor is "
                "[steps, q_heads, key_dim] (or [1, ...]); capture one sequence (batch index 0, "
                "e.g. t[0:1])");
  fs::remove(d.path() / "layers.1.q.npy");
  // Non-finite values are named.
  std::vector<float> bad = fill(ks, key_value);
  bad[77] = std::nanf("");
  d.npy("k.npy", ks, bad);
  EXPECT_EQ(error_of("tiny-gqa", replay_of(d.path())),
            d.file("k.npy") +
                ": element 77 (flat index) is NaN; capture finite values (a float16 overflow "
                "shows as inf; capture in bfloat16 or float32)");
  // Paths that are neither a directory nor a safetensors file.
  EXPECT_EQ(error_of("tiny-gqa", replay_of(d.path() / "nothing")),
            at + "/nothing: does not exist; point it at a directory holding k.npy and q.npy, or "
                 "at a .safetensors file");
  EXPECT_EQ(error_of("tiny-gqa", replay_of(d.path() / "k.npy")),
            "workload.replay_path: " + d.file("k.npy") +
                ": is neither a directory nor a .safetensors file; point it at a directory "
                "holding k.npy and q.npy, or at a .safetensors file with tensors k and q");
  EXPECT_EQ(error_of("tiny-gqa", replay_of("")),
            "workload.replay_path: generator 'replay' needs a path to captured tensors; set "
            "workload.replay_path to a directory of .npy files or a .safetensors file");
  // Safetensors: integer tensors are not captures; a missing k is named with the file's form.
  const fs::path st = d.path() / "c.safetensors";
  write_safetensors(
      st,
      {{"k", DType::i32, {kKv, kTokens, kDim}, std::vector<std::uint8_t>(kKv * kTokens * kDim * 4)},
       {"q", DType::f32, qs, encode_floats(fill(qs, query_value), DType::f32)}});
  EXPECT_EQ(error_of("tiny-gqa", replay_of(st)),
            st.string() +
                ": tensor k: dtype i32 is not a float type; store captured tensors as F32, "
                "BF16, F16 or F8_E4M3");
  write_safetensors(st, {{"q", DType::f32, qs, encode_floats(fill(qs, query_value), DType::f32)}});
  EXPECT_EQ(error_of("tiny-gqa", replay_of(st)),
            "workload.replay_path: " + st.string() +
                ": holds no captured keys (k); add a tensor \"k\" (or \"layers.N.k\" per layer)");
}

/// Two requests of 48 tokens of tiny-gqa decoding over the capture in `d`.
EngineConfig replay_engine_config(const ReplayDir& d, Mode mode, int top_k) {
  EngineConfig c;
  c.mode = mode;
  c.concurrency = 2;
  c.context_length = 48;
  c.top_k = top_k;
  c.workload = replay_of(d.path());
  return c;
}

TEST(ModelReplay, DecodeEngineRunsOnAReplayedWorkload) {
  const ReplayDir d("engine");
  write_gqa_capture(d, true);
  DecodeEngine engine(load_model("tiny-gqa"), replay_engine_config(d, Mode::sparse_gpu, 16));
  for (int s = 0; s < 2; ++s) {
    const StepStats stats = engine.step();
    ASSERT_EQ(stats.next_tokens.size(), 2u);
    for (auto t : stats.next_tokens) EXPECT_GE(t, 0);
  }
  EXPECT_EQ(engine.sequence_length(), 50);
}

// A capture's queries are the data being measured: attention reads them exactly as captured
// (step s, captured step s mod steps), with none of the model's own query mixed in. A synthetic
// workload's queries get a quarter of the model's (by RMS).
TEST(ModelReplay, AttentionReadsTheCapturedQueriesUnchanged) {
  const ReplayDir d("queries");
  write_gqa_capture(d, true);  // 3 steps of queries
  const EngineConfig c = replay_engine_config(d, Mode::fathom, 40);
  DecodeEngine engine(load_model("tiny-gqa"), c);
  EXPECT_TRUE(engine.last_queries(0).empty());
  for (int step = 0; step < 4; ++step) {
    (void)engine.step();
    for (int layer : {0, 1}) {
      const auto q = engine.last_queries(layer);
      ASSERT_EQ(q.size(), static_cast<std::size_t>(2 * kQ * kDim));
      for (int b = 0; b < 2; ++b)
        for (int h = 0; h < kQ; ++h)
          for (int j = 0; j < kDim; ++j)
            ASSERT_EQ(q[static_cast<std::size_t>((b * kQ + h) * kDim + j)],
                      query_value(layer, step % kSteps, h, j))
                << "step " << step << " layer " << layer << " request " << b;
    }
  }
  EngineConfig synthetic = c;
  synthetic.workload = WorkloadSpec{};
  DecodeEngine blended(load_model("tiny-gqa"), synthetic);
  (void)blended.step();
  const KvWorkload workload(load_model("tiny-gqa"), synthetic.workload, 2, 48);
  std::vector<float> wl(static_cast<std::size_t>(kQ * kDim));
  workload.queries(0, 0, 0, wl.data());
  const auto q = blended.last_queries(0);
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < wl.size(); ++i) {
    diff += (q[i] - wl[i]) * (q[i] - wl[i]);
    norm += wl[i] * wl[i];
  }
  EXPECT_NEAR(std::sqrt(diff / norm), 0.25, 0.01);  // per head exactly 0.25 of its RMS
  EXPECT_EQ(test::error_message([&] { (void)engine.last_queries(2); }),
            "last_queries: layer 2 is outside 0..1; pass a layer of the model");
}

TEST(ModelReplay, CommittedFixtureLoadsAndRunsThroughTheCli) {
  const fs::path fixture = fs::path(HISPARSE_TEST_FIXTURES) / "replay";
  WorkloadSpec spec = replay_of(fixture / "tiny-gqa");
  const KvWorkload w(load_model("tiny-gqa"), spec, 1, 192);
  EXPECT_EQ(w.capture()->tokens(), 256);
  EXPECT_EQ(w.capture()->steps(), 8);
  EXPECT_EQ(w.capture()->key_layers(), 1);
  EXPECT_EQ(w.notes().size(), 3u);  // keys and queries reused across layers, synthetic values
  const test::TempDir out;
  const auto r = test::run_bench(
      fmt::format("run {} --out {} --quiet --set sweep.mode=[sparse-gpu] --set decode_steps=1 "
                  "--set warmup_steps=0",
                  (fixture / "tiny_gqa_replay.yaml").string(), out.path.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string summary = test::read_text(out.path / "summary.md");
  EXPECT_NE(summary.find("replayed workload"), std::string::npos) << summary;
  // What the capture lacked is recorded with every point.
  const auto json = test::read_json(out.path / "results.json");
  const auto& notes = json.at("points").at(0).at("metrics").at("workload_notes");
  ASSERT_EQ(notes.size(), 3u) << notes.dump();
  EXPECT_EQ(notes.at(2).get<std::string>(), "no values (v) captured: values are synthetic N(0, 1)");
}

// Every row of a study equals the other's, bit for bit.
void expect_same_rows(const std::vector<fathom::QualityRow>& got,
                      const std::vector<fathom::QualityRow>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t r = 0; r < want.size(); ++r) {
    EXPECT_EQ(got[r].name, want[r].name);
    EXPECT_EQ(got[r].bits_per_token, want[r].bits_per_token) << want[r].name;
    EXPECT_EQ(got[r].recall, want[r].recall) << want[r].name;
    EXPECT_EQ(got[r].attention_error, want[r].attention_error) << want[r].name;
  }
}

/// The study's synthetic workload shaped like tiny-gqa's heads (4 query heads per KV head, head_dim
/// 32): 2048 tokens, 2 test steps, 3 held-out calibration queries, top_k 64.
fathom::QualityConfig tiny_gqa_study(int kv_heads) {
  fathom::QualityConfig synthetic;
  synthetic.workload.channels = kDim;
  synthetic.workload.heads = kQ / kKv;
  synthetic.workload.tokens = 2048;
  synthetic.workload.steps = 2;
  synthetic.workload.calibration_queries = 3;
  synthetic.kv_heads = kv_heads;
  synthetic.top_k = 64;
  return synthetic;
}

TEST(ReplayStudy, CaptureOfTheSyntheticWorkloadGivesTheSyntheticStudy) {
  // Two synthetic KV heads shaped like tiny-gqa (4 query heads each, head_dim 32), written out as
  // a capture: 3 held-out calibration queries, then 2 test steps. The replayed study must equal
  // the synthetic one row for row, number for number.
  const fathom::QualityConfig synthetic = tiny_gqa_study(kKv);
  std::vector<fathom::SyntheticKeys> heads;
  for (int h = 0; h < kKv; ++h)
    heads.push_back(fathom::make_synthetic_keys(fathom::study_head_spec(synthetic.workload, h)));
  const auto as_floats = [](const std::vector<std::uint16_t>& bf16) {
    std::vector<float> f(bf16.size());
    std::transform(bf16.begin(), bf16.end(), f.begin(), bf16_to_float);
    return f;
  };
  std::vector<float> k, v, q;
  for (const auto& h : heads) {
    const auto hk = as_floats(h.keys), hv = as_floats(h.values);
    k.insert(k.end(), hk.begin(), hk.end());
    v.insert(v.end(), hv.begin(), hv.end());
  }
  const std::size_t group_values = static_cast<std::size_t>(kQ / kKv) * kDim;
  for (int s = 0; s < 5; ++s)
    for (const auto& h : heads) {
      const float* from = s < 3 ? h.calibration_queries.data() + s * group_values : h.query(s - 3);
      q.insert(q.end(), from, from + group_values);
    }
  const ReplayDir d("study");
  d.npy("k.npy", {kKv, 2048, kDim}, k, NpyType::bf16);
  d.npy("v.npy", {kKv, 2048, kDim}, v, NpyType::bf16);
  d.npy("q.npy", {5, kQ, kDim}, q);
  const ReplayStudySource source(d.path(), load_model("tiny-gqa"), 0, 3);
  EXPECT_EQ(source.heads(), kKv);
  EXPECT_EQ(source.layers(), std::vector<int>{0});
  EXPECT_EQ(source.tokens(), 2048);
  EXPECT_EQ(source.test_steps(), 2);
  EXPECT_TRUE(source.captured_values());
  fathom::QualityConfig replayed = synthetic;
  replayed.workload = {};  // unused with a source
  replayed.source = [&](int h) { return source.head(h); };
  const auto want = fathom::quality_study(synthetic);
  const auto got = fathom::quality_study(replayed);
  expect_same_rows(got, want);
  // Without values the heads still load, with seeded synthetic values and a note saying so.
  fs::remove(d.path() / "v.npy");
  const ReplayStudySource no_values(d.path(), load_model("tiny-gqa"), 1024, 1);
  EXPECT_FALSE(no_values.captured_values());
  EXPECT_EQ(no_values.test_steps(), 4);
  EXPECT_EQ(no_values.notes().back(), "no values (v) captured: values are synthetic N(0, 1)");
  const auto h1 = no_values.head(1);
  EXPECT_EQ(h1.keys.size(), 1024u * kDim);
  EXPECT_EQ(h1.values, no_values.head(1).values);
  EXPECT_NE(h1.values, no_values.head(0).values);
  EXPECT_EQ(std::vector<float>(h1.queries.begin(), h1.queries.begin() + group_values),
            std::vector<float>(heads[1].calibration_queries.begin() + group_values,
                               heads[1].calibration_queries.begin() + 2 * group_values));
}

TEST(ReplayStudy, BadChoicesNameTheFlagAndTheFix) {
  const ReplayDir d("study_errors");
  write_gqa_capture(d, false);  // 2 layers, 64 tokens, 3 steps
  const auto message = [&](const std::string& model, std::int64_t tokens, int calibration,
                           std::vector<int> layers = {}) {
    return test::error_message(
        [&] { (void)ReplayStudySource(d.path(), load_model(model), tokens, calibration, layers); });
  };
  EXPECT_EQ(message("tiny-dsa", 0, -1),
            "--model: tiny-dsa is an MLA model; the Fathom quality study needs a GQA model (query "
            "heads grouped over KV heads); pass the GQA model the capture came from");
  EXPECT_EQ(message("tiny-gqa", 65, -1),
            "--tokens: 65 tokens, the capture holds 64; use at most 64 tokens, or leave --tokens "
            "out to use them all");
  EXPECT_EQ(message("tiny-gqa", 0, 3),
            "--calibration-steps: 3 of 3 captured query steps held out for calibration; hold out "
            "1 to 2 steps");
  EXPECT_EQ(message("tiny-gqa", 0, -1, {0, 2}),
            "--layers: layer 2 was not captured; use layers 0 to 1 (2 captured)");
  const ReplayStudySource layer1(d.path(), load_model("tiny-gqa"), 0, -1, {1});
  EXPECT_EQ(layer1.heads(), kKv);
  EXPECT_EQ(layer1.calibration_steps(), 1);
  // Study head 1 is layer 1's KV head 1: keys as captured, queries of query heads 4..7.
  const auto h = layer1.head(1);
  EXPECT_EQ(bf16_to_float(h.keys[5 * kDim + 7]), key_value(1, 1, 5, 7));
  EXPECT_EQ(h.queries[0], query_value(1, 1, 4, 0));
  EXPECT_EQ(h.calibration_queries[kDim + 3], query_value(1, 0, 5, 3));
}

// `hisparse-bench capture`: the study's generator written for a model's shape, one file per layer.
// Studied as a scenario replaying it (its test steps decoded), it is the synthetic study of
// layers x KV heads heads, row for row and number for number.
TEST(SyntheticCapture, ReplayedItIsTheSyntheticStudy) {
  const fathom::QualityConfig synthetic = tiny_gqa_study(2 * kKv);  // 2 layers x 2 KV heads
  const ReplayDir d("synthetic_capture");
  fathom::SyntheticKeySpec spec = synthetic.workload;
  spec.channels = 7;  // taken from the model
  const SyntheticCaptureSummary written =
      write_synthetic_capture(d.path(), load_model("tiny-gqa"), spec, "capture --out");
  EXPECT_EQ(written.layers, 2);
  EXPECT_EQ(written.kv_heads, kKv);
  EXPECT_EQ(written.head_dim, kDim);
  EXPECT_EQ(written.steps, 5);
  EXPECT_EQ(written.bytes, fs::file_size(d.path() / "layers.0.k.npy") * 2 +
                               fs::file_size(d.path() / "layers.0.v.npy") * 2 +
                               fs::file_size(d.path() / "layers.1.q.npy") * 2);
  // A scenario replaying it with 2 decode steps: the study holds out the 3 steps after them.
  WorkloadSpec replay;
  replay.generator = "replay";
  replay.replay_path = d.path().string();
  const WorkloadStudySource source(load_model("tiny-gqa"), replay, 2048, 2, 3, "--scenario");
  ASSERT_EQ(source.heads(), 2 * kKv);
  fathom::QualityConfig replayed = synthetic;
  replayed.workload = {};
  replayed.source = [&](int h) { return source.head(h); };
  const auto want = fathom::quality_study(synthetic);
  const auto got = fathom::quality_study(replayed);
  expect_same_rows(got, want);
  EXPECT_EQ(test::error_message([&] {
              (void)write_synthetic_capture(d.path(), load_model("tiny-dsa"), spec,
                                            "capture --out");
            }),
            "capture --out: model tiny-dsa uses MLA; synthetic captures are written for GQA models "
            "(query heads grouped over KV heads)");
}

// `quality --scenario`: study head i is (model layer i / kv_heads, KV head i % kv_heads) of the
// scenario's first request. Keys and values are the workload's (as bf16), the test queries are its
// decode steps 0.., and the held-out calibration queries the steps after them.
TEST(WorkloadStudy, HeadsAreTheScenariosLayersAndKvHeadsOverItsSteps) {
  const ModelSpec model = load_model("tiny-gqa");  // 2 layers x 2 KV heads, 4 query heads each
  WorkloadSpec spec;
  spec.seed = 9;
  const WorkloadStudySource source(model, spec, 300, 3, 2, "--scenario");
  ASSERT_EQ(source.heads(), 4);
  EXPECT_EQ(source.group(), 4);
  EXPECT_EQ(source.tokens(), 300);
  const KvWorkload workload(model, spec, 1, 300);
  const int d = model.gqa.head_dim;
  std::vector<float> keys(300 * static_cast<std::size_t>(d)),
      values = keys, q(static_cast<std::size_t>(model.gqa.q_heads) * d);
  const auto h = source.head(3);  // layer 1, KV head 1: query heads 4..7
  workload.keys(0, 1, 1, 0, 300, keys.data());
  workload.values(0, 1, 1, 0, 300, values.data());
  for (std::size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(h.keys[i], float_to_bf16(keys[i])) << i;
    ASSERT_EQ(h.values[i], float_to_bf16(values[i])) << i;
  }
  const auto group_values = static_cast<std::size_t>(4 * d);
  ASSERT_EQ(h.queries.size(), 3 * group_values);
  ASSERT_EQ(h.calibration_queries.size(), 2 * group_values);
  for (int step = 0; step < 5; ++step) {
    workload.queries(0, 1, step, q.data());
    const float* got = step < 3 ? h.queries.data() + step * group_values
                                : h.calibration_queries.data() + (step - 3) * group_values;
    for (std::size_t i = 0; i < group_values; ++i)
      ASSERT_EQ(got[i], q[group_values + i]) << "step " << step << " value " << i;
  }
  EXPECT_EQ(test::error_message([&] {
              (void)WorkloadStudySource(load_model("tiny-dsa"), spec, 300, 3, 2, "--scenario");
            }),
            "--scenario: model tiny-dsa uses MLA; the Fathom quality study needs a GQA model "
            "(query heads grouped over KV heads)");
  // A replayed capture (8 query steps) must hold the decode steps and the held-out ones.
  WorkloadSpec replay;
  replay.generator = "replay";
  replay.replay_path = (fs::path(HISPARSE_TEST_FIXTURES) / "replay" / "tiny-gqa").string();
  EXPECT_EQ(WorkloadStudySource(model, replay, 192, 3, 5, "--scenario").heads(), 4);
  EXPECT_EQ(test::error_message(
                [&] { (void)WorkloadStudySource(model, replay, 192, 3, 6, "--scenario"); }),
            "--scenario: the capture holds 8 query steps; the scenario decodes 3 and the study "
            "holds out 6 more for calibration; capture more decode steps, or lower "
            "--calibration-steps");
}

}  // namespace
}  // namespace hisparse
