// Fathom quantization, bit planes (both layouts), partial reads and append.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/dtypes.hpp"
#include "core/error.hpp"
#include "core/rng.hpp"
#include "fathom/plane_store.hpp"
#include "kernels/fathom/plane_scan.hpp"
#include "kernels/fathom/quantize_pack.hpp"
#include "support/error_message.hpp"

namespace hisparse::fathom {
namespace {
namespace kf = kernels::fathom;

std::vector<std::uint16_t> random_keys(std::int64_t tokens, int d, std::uint64_t seed) {
  std::vector<std::uint16_t> k(static_cast<std::size_t>(tokens) * d);
  for (std::size_t i = 0; i < k.size(); ++i)
    k[i] = float_to_bf16(random_normal(seed, i) *
                         (1.0f + static_cast<float>(i % static_cast<std::size_t>(d)) / 8.0f));
  return k;
}

std::uint32_t code_from_planes(const PlaneStore& s, int stream, std::int64_t token, int ch) {
  const auto& L = s.layout();
  const std::uint64_t* w = s.host_words() + stream * L.words_per_stream();
  std::uint32_t c = 0;
  for (int p = 0; p < 4; ++p)
    c = (c << 1) |
        static_cast<std::uint32_t>((w[L.word_index(token / 64, ch, p)] >> (token % 64)) & 1u);
  return c;
}

TEST(FathomQuantize, HandWorkedCodes) {
  EXPECT_EQ(kf::quantize_code(0.3f, 2.0f), 9u);    // floor(0.3 / 0.25) = 1
  EXPECT_EQ(kf::quantize_code(-2.0f, 2.0f), 0u);   // floor(-8) = -8
  EXPECT_EQ(kf::quantize_code(1.99f, 2.0f), 15u);  // floor(7.96) = 7
  EXPECT_EQ(kf::quantize_code(2.0f, 2.0f), 15u);   // floor(8) = 8, clipped to 7
  EXPECT_EQ(kf::quantize_code(-0.1f, 2.0f), 7u);   // floor(-0.4) = -1
  EXPECT_EQ(kf::quantize_code(0.0f, 2.0f), 8u);
  EXPECT_EQ(kf::quantize_code(5.0f, 0.0f), 8u);  // all-zero block
  // The scale is rounded to fp16 before coding: 1.0001 -> 1.0, so 1.0001 codes as 8 -> clip 7.
  EXPECT_EQ(kf::block_scale_f16(1.0001f), 0x3c00);
  EXPECT_EQ(kf::quantize_code(1.0001f, f16_to_float(kf::block_scale_f16(1.0001f))), 15u);
  EXPECT_EQ(kf::block_scale_f16(1e6f), 0x7bff);  // clamped to the fp16 range
}

TEST(FathomQuantize, PlaneWordsOfOneBlock) {
  // One channel, 64 tokens: token i has key (i % 16 - 8) / 8 * 2 -> codes i % 16 with absmax 2.
  std::vector<std::uint16_t> keys(64);
  for (int i = 0; i < 64; ++i) keys[i] = float_to_bf16(static_cast<float>(i % 16 - 8) * 0.25f);
  keys[5] = float_to_bf16(2.0f);  // absmax 2 (code 15, clipped)
  PlaneStore store(Backend::cpu, PlaneLayoutKind::host, 1, 1, 64);
  store.append(0, 1, keys.data(), 1, 0, 64);
  EXPECT_EQ(store.host_scales()[0], float_to_f16(2.0f));
  for (int i = 0; i < 64; ++i)
    EXPECT_EQ(code_from_planes(store, 0, i, 0), i == 5 ? 15u : static_cast<std::uint32_t>(i % 16))
        << i;
  // Plane 0 (MSB) is set exactly for codes >= 8: tokens with i % 16 >= 8, and token 5.
  std::uint64_t msb = 0;
  for (int i = 0; i < 64; ++i)
    if (i % 16 >= 8 || i == 5) msb |= std::uint64_t{1} << i;
  EXPECT_EQ(store.host_words()[store.layout().word_index(0, 0, 0)], msb);
}

TEST(FathomPlaneLayout, IndicesWorkedByHand) {
  // HBM: [superblock][channel][plane][16] words and [superblock][channel][16] scales. Block 37 is
  // superblock 2, position 5; with 3 channels, (channel 1, plane 2) is run 6 of superblock 2.
  const kf::PlaneLayout hbm{kf::PlaneLayoutKind::hbm, 3, 64};
  EXPECT_EQ(hbm.word_index(37, 1, 2), ((2 * 3 + 1) * 4 + 2) * 16 + 5);  // 485
  EXPECT_EQ(hbm.scale_index(37, 1), (2 * 3 + 1) * 16 + 5);              // 117
  EXPECT_EQ(hbm.unit_stride(), 16);
  EXPECT_EQ(hbm.block_offset(37, kf::kPlanes), 2 * 3 * 4 * 16 + 5);
  // Host: [channel][plane][capacity] words and [channel][capacity] scales.
  const kf::PlaneLayout host{kf::PlaneLayoutKind::host, 3, 64};
  EXPECT_EQ(host.word_index(37, 1, 2), (1 * 4 + 2) * 64 + 37);  // 421
  EXPECT_EQ(host.scale_index(37, 1), 1 * 64 + 37);              // 101
  EXPECT_EQ(host.unit_stride(), 64);
  EXPECT_EQ(host.block_offset(37, kf::kPlanes), 37);
}

TEST(FathomQuantize, RoundTripBothLayoutsEqualTheRule) {
  const int d = 24;
  const std::int64_t n = 64 * 40 + 17;  // crosses superblocks, ends mid-block
  const auto keys = random_keys(n, d, 7);
  PlaneStore host(Backend::cpu, PlaneLayoutKind::host, 1, d, n);
  PlaneStore hbm(Backend::cpu, PlaneLayoutKind::hbm, 1, d, n);
  host.append(0, 1, keys.data(), d, 0, n);
  hbm.append(0, 1, keys.data(), d, 0, n);
  for (std::int64_t b = 0; b * 64 < n; ++b)
    for (int j = 0; j < d; ++j) {
      float absmax = 0;
      for (std::int64_t i = b * 64; i < std::min(n, b * 64 + 64); ++i)
        absmax = std::max(absmax, std::fabs(bf16_to_float(keys[i * d + j])));
      const std::uint16_t scale = float_to_f16(absmax);
      ASSERT_EQ(host.host_scales()[host.layout().scale_index(b, j)], scale);
      ASSERT_EQ(hbm.host_scales()[hbm.layout().scale_index(b, j)], scale);
      for (std::int64_t i = b * 64; i < std::min(n, b * 64 + 64); ++i) {
        const auto expect = kf::quantize_code(bf16_to_float(keys[i * d + j]), f16_to_float(scale));
        ASSERT_EQ(code_from_planes(host, 0, i, j), expect) << i << " " << j;
        ASSERT_EQ(code_from_planes(hbm, 0, i, j), expect) << i << " " << j;
      }
    }
}

TEST(FathomQuantize, AppendInPiecesEqualsOneQuantization) {
  const int d = 16, streams = 3;
  const std::int64_t n = 64 * 5 + 9;
  const auto keys = random_keys(n * streams, d, 11);  // [stream][token][d]
  for (auto kind : {PlaneLayoutKind::host, PlaneLayoutKind::hbm}) {
    PlaneStore bulk(Backend::cpu, kind, streams, d, n);
    bulk.append(0, streams, keys.data(), d, n * d, n);
    PlaneStore pieces(Backend::cpu, kind, streams, d, n);
    std::int64_t done = 0;
    for (std::int64_t piece : {1, 1, 70, 3, 64, 100, 1}) {
      pieces.append(0, streams, keys.data() + done * d, d, n * d, piece);
      done += piece;
    }
    pieces.append(0, streams, keys.data() + done * d, d, n * d, n - done);
    EXPECT_EQ(pieces.length(2), n);
    const auto& L = bulk.layout();
    for (int s = 0; s < streams; ++s)
      for (std::int64_t b = 0; b * 64 < n; ++b)
        for (int j = 0; j < d; ++j) {
          ASSERT_EQ(bulk.host_scales()[s * L.scales_per_stream() + L.scale_index(b, j)],
                    pieces.host_scales()[s * L.scales_per_stream() + L.scale_index(b, j)]);
          for (int p = 0; p < 4; ++p)
            ASSERT_EQ(bulk.host_words()[s * L.words_per_stream() + L.word_index(b, j, p)],
                      pieces.host_words()[s * L.words_per_stream() + L.word_index(b, j, p)]);
        }
  }
}

TEST(FathomQuantize, AppendErrorsNameTheProblem) {
  PlaneStore store(Backend::cpu, PlaneLayoutKind::hbm, 2, 8, 100);
  std::vector<std::uint16_t> keys(8 * 2000);
  EXPECT_EQ(store.capacity_tokens(), 1024);  // rounded up to one superblock
  EXPECT_EQ(test::error_message([&] { store.append(0, 2, keys.data(), 8, 0, 1025); }),
            "fathom plane store: appending 1025 tokens to 0 exceeds the capacity of 1024 tokens; "
            "create the store with a larger capacity");
  store.append(0, 1, keys.data(), 8, 0, 3);
  EXPECT_THROW(store.append(0, 2, keys.data(), 8, 0, 1), Error);  // unequal lengths
}

TEST(FathomPartialRead, EveryDepthAndCodeEqualsTheFormula) {
  const float a = 1.75f;
  for (std::uint32_t c = 0; c < 16; ++c) {
    EXPECT_EQ(kf::partial_value(c, 0, a), 0.0f);
    for (int t = 1; t <= 4; ++t) {
      const double ct = static_cast<double>(c >> (4 - t));
      const double half = std::ldexp(1.0, t - 1);
      EXPECT_EQ(static_cast<double>(kf::partial_value(c, t, a)), (ct + 0.5 - half) * a / half)
          << c << " " << t;
    }
  }
  EXPECT_EQ(kf::partial_value(15, 4, 8.0f), 7.5f);  // top cell midpoint (7 + 0.5) * a / 8
  EXPECT_EQ(kf::partial_value(0, 1, 8.0f), -4.0f);  // sign plane only: -a/2
}

TEST(FathomPartialRead, ScanReconstructsEveryTokenAtEveryDepth) {
  // A unit query on one channel makes the score equal the partial value of that token.
  const int d = 4;
  const std::int64_t n = 64 * 3 + 5;
  const auto keys = random_keys(n, d, 3);
  PlaneStore store(Backend::cpu, PlaneLayoutKind::host, 1, d, n);
  store.append(0, 1, keys.data(), d, 0, n);
  for (int t = 0; t <= 4; ++t) {
    std::vector<float> q = {0, 0, 1, 0};
    std::vector<std::uint8_t> depths = {4, 0, static_cast<std::uint8_t>(t), 0};
    q[0] = 0.0f;  // channel 0 is read but weighted 0
    kf::PlaneScanArgs args;
    args.words = store.words();
    args.scales = store.scales();
    args.layout = store.layout();
    args.queries = q.data();
    args.depths = depths.data();
    args.streams = 1;
    args.heads = 1;
    std::vector<float> scores(static_cast<std::size_t>(n));
    kf::plane_scores_ref(args, 0, n, scores.data());
    for (std::int64_t i = 0; i < n; ++i) {
      const float a = f16_to_float(store.host_scales()[store.layout().scale_index(i / 64, 2)]);
      const auto code = code_from_planes(store, 0, i, 2);
      ASSERT_EQ(scores[i], kf::partial_value(code, t, a)) << t << " " << i;
    }
  }
}

TEST(FathomStore, BytesPerTokenIs68AtHeadDim128) {
  PlaneStore store(Backend::cpu, PlaneLayoutKind::hbm, 1, 128, 64);
  EXPECT_DOUBLE_EQ(store.bytes_per_token(), 68.0);
}

}  // namespace
}  // namespace hisparse::fathom
