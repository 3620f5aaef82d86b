// Every allocation site of the CPU decode engine, failed one at a time by the injection hook:
// each failure is an OutOfMemoryError naming what was being allocated, nothing it allocated
// before stays allocated, and the Runner turns it into a point failure that names the fix.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "bench/runner.hpp"
#include "core/error.hpp"
#include "core/memory.hpp"
#include "model/decode_engine.hpp"
#include "model/model_spec.hpp"

namespace hisparse {
namespace {

constexpr MemoryKind kKinds[] = {MemoryKind::host, MemoryKind::pinned, MemoryKind::device};

EngineConfig config(Mode mode) {
  EngineConfig c;
  c.mode = mode;
  c.concurrency = 2;
  c.context_length = 256;
  c.top_k = 48;
  c.hot_buffer = 192;  // a Fathom selection of 4 query heads (hisparse+fathom) fits
  c.max_decode_steps = 2;
  return c;
}

/// Builds the engine and runs two steps.
void decode(const ModelSpec& model, const EngineConfig& c) {
  DecodeEngine engine(model, c);
  (void)engine.step();
  (void)engine.step();
}

struct Case {
  const char* model;
  Mode mode;
};

TEST(CoreAllocationFailure, EverySiteNamesItselfAndReleasesWhatItHeld) {
  const Case cases[] = {{"tiny-dsa", Mode::dense},
                        {"tiny-dsa", Mode::sparse_gpu},
                        {"tiny-dsa", Mode::hisparse},
                        {"tiny-gqa", Mode::fathom},
                        {"tiny-gqa", Mode::hisparse_fathom}};
  std::size_t sites = 0;
  for (const Case& k : cases) {
    const ModelSpec model = load_model(k.model);
    for (MemoryKind kind : kKinds) {
      const std::size_t live_before = live_allocations(kind);
      // Fail the 1st, 2nd, ... allocation of this kind until the decode needs no more of them.
      for (std::size_t nth = 1;; ++nth) {
        SCOPED_TRACE(
            fmt::format("{} {} {} allocation {}", k.model, name_of(k.mode), name_of(kind), nth));
        inject_allocation_failure(kind, nth);
        bool failed = false;
        try {
          decode(model, config(k.mode));
        } catch (const OutOfMemoryError& e) {
          failed = true;
          ++sites;
          EXPECT_EQ(e.kind(), kind);
          EXPECT_FALSE(e.where().empty());
          EXPECT_NE(e.problem().find("cannot allocate"), std::string::npos) << e.what();
          EXPECT_GT(e.bytes(), 0u);
          EXPECT_FALSE(e.fix().empty());
        }
        inject_allocation_failure(kind, 0);
        EXPECT_EQ(live_allocations(kind), live_before);  // the engine released all it held
        if (!failed) break;
        ASSERT_LT(nth, 1000u) << "the decode keeps allocating";
      }
    }
  }
  EXPECT_GT(sites, 50u);  // the engine's buffers, each failed once per mode
}

TEST(CoreAllocationFailure, APointThatCannotAllocateFailsWithTheKeysToChange) {
  const ModelSpec model = load_model("tiny-dsa");
  const Runner runner(Backend::cpu, MemoryBudget{1e12, 0, "test budget"});
  inject_allocation_failure(MemoryKind::pinned, 1);  // the host KV pool of the hisparse mode
  try {
    (void)runner.run(model, config(Mode::hisparse), {0, 1});
    FAIL() << "no error";
  } catch (const OutOfMemoryError&) {
    FAIL() << "the Runner passed the raw allocation failure on";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "tiny-dsa hisparse at context 256");
    EXPECT_EQ(e.problem().rfind("host KV pool (2 requests x 3 layers x ", 0), 0u) << e.what();
    EXPECT_NE(e.problem().find("cannot allocate"), std::string::npos) << e.what();
    // The memory is free (the failure was injected): the capacity model says the point fits.
    EXPECT_NE(e.fix().find("so something else holds the memory"), std::string::npos) << e.what();
  }
  inject_allocation_failure(MemoryKind::pinned, 0);
  EXPECT_EQ(live_allocations(MemoryKind::pinned), 0u);
  EXPECT_NO_THROW((void)runner.run(model, config(Mode::hisparse), {0, 1}));
}

}  // namespace
}  // namespace hisparse
