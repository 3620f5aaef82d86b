// launch_gemm: Y = alpha * X * W^T + beta * Y through cuBLASLt, fp32 out with fp32 compute: fp32
// in (no TF32: the engine's CUDA path is checked against the CPU twin, and the tiny models' greedy
// tokens must not flip on a rounding change), or bf16 weights with X rounded to bf16 first
// (round_to_bf16, the twin's rounding; bf16 products are exact in fp32, so only the order of the
// sum differs from the twin). Row-major Y [m x n] is column-major Y^T
// [n x m], so the call is C(n x m) = op_T(W as k x n) * X(k x m). One algorithm is chosen per
// shape and kept; a workspace is allocated per stream on its first GEMM and reused.
#include <cublasLt.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include <fmt/format.h>

#include "core/cuda_check.hpp"
#include "core/error.hpp"
#include "kernels/gemm/gemm.hpp"

namespace hisparse::kernels {
namespace {

constexpr std::size_t kWorkspaceBytes = 32u << 20;

void check_cublas(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error("cuBLASLt", fmt::format("{} failed: {}", call, cublasLtGetStatusString(status)),
                "check that the GPU and the CUDA toolkit match (nvidia-smi, nvcc --version)");
}
#define HISPARSE_CUBLAS(call) check_cublas((call), #call)

using ShapeKey =
    std::tuple<int, int, int, int, int, int, bool, bool>;  // m n k ldx ldw ldy beta!=0 bf16

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool has_algo = false;
};

// One per process: the handle, the workspace and the plans of every shape seen. Guarded by a
// mutex: plans are made once, so the lock is uncontended after warm-up.
class GemmPlans {
 public:
  static GemmPlans& instance() {
    static GemmPlans plans;
    return plans;
  }
  GemmPlans(const GemmPlans&) = delete;
  GemmPlans& operator=(const GemmPlans&) = delete;

  void run(const GemmArgs& g, cudaStream_t stream) {
    const int ldx = g.ldx ? g.ldx : g.k, ldw = g.ldw ? g.ldw : g.k, ldy = g.ldy ? g.ldy : g.n;
    std::lock_guard lock(mutex_);
    if (!handle_) HISPARSE_CUBLAS(cublasLtCreate(&handle_));
    void* workspace = workspace_of(stream);
    const bool bf16 = g.w_bf16 != nullptr;
    const ShapeKey key{g.m, g.n, g.k, bf16 ? g.k : ldx, ldw, ldy, g.beta != 0.0f, bf16};
    auto it = plans_.find(key);
    if (it == plans_.end())
      it = plans_.emplace(key, make_plan(g.m, g.n, g.k, bf16 ? g.k : ldx, ldw, ldy, bf16)).first;
    const Plan& p = it->second;
    const void* w = bf16 ? static_cast<const void*>(g.w_bf16) : g.w;
    const void* x = bf16 ? static_cast<const void*>(g.x_bf16) : g.x;
    HISPARSE_CUBLAS(cublasLtMatmul(handle_, p.desc, &g.alpha, w, p.a, x, p.b, &g.beta, g.y, p.c,
                                   g.y, p.c, p.has_algo ? &p.algo : nullptr, workspace,
                                   kWorkspaceBytes, stream));
  }

 private:
  GemmPlans() = default;
  ~GemmPlans() = default;  // the process ends with the handle: destroying it after the CUDA
                           // runtime has shut down would fail, so it is left to the driver

  Plan make_plan(int m, int n, int k, int ldx, int ldw, int ldy, bool bf16) {
    const cudaDataType_t in = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    Plan p;
    HISPARSE_CUBLAS(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t trans = CUBLAS_OP_T, none = CUBLAS_OP_N;
    HISPARSE_CUBLAS(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans)));
    HISPARSE_CUBLAS(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof(none)));
    // Column-major views: W^T is (k x n, ld ldw), X is (k x m, ld ldx), Y is (n x m, ld ldy).
    HISPARSE_CUBLAS(cublasLtMatrixLayoutCreate(&p.a, in, k, n, ldw));
    HISPARSE_CUBLAS(cublasLtMatrixLayoutCreate(&p.b, in, k, m, ldx));
    HISPARSE_CUBLAS(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, n, m, ldy));
    cublasLtMatmulPreference_t pref = nullptr;
    HISPARSE_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    const std::size_t ws = kWorkspaceBytes;
    HISPARSE_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    HISPARSE_CUBLAS(cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.c, p.c, pref, 1,
                                                   &result, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    if (found > 0) {
      p.algo = result.algo;
      p.has_algo = true;
    }
    return p;
  }

  // GEMMs on two streams may run at once (the decode engine's selection stream), so each stream
  // has its own workspace; made on a stream's first GEMM (a warm-up step, never inside a capture).
  void* workspace_of(cudaStream_t stream) {
    void*& w = workspaces_[stream];
    if (w == nullptr) HISPARSE_CUDA_CHECK(cudaMalloc(&w, kWorkspaceBytes));
    return w;
  }

  std::mutex mutex_;
  cublasLtHandle_t handle_ = nullptr;
  std::map<cudaStream_t, void*> workspaces_;
  std::map<ShapeKey, Plan> plans_;
};

}  // namespace

void launch_gemm(const GemmArgs& args, cudaStream_t stream) {
  if (args.m <= 0 || args.n <= 0) return;
  if (args.w_bf16 != nullptr) {
    if (args.x_bf16 == nullptr)
      throw Error("gemm", "bf16 weights need GemmArgs::x_bf16 for the rounded activations",
                  "give an [m x k] bf16 device buffer");
    launch_round_to_bf16(args.x, args.m, args.k, args.ldx ? args.ldx : args.k, args.x_bf16, stream);
  }
  GemmPlans::instance().run(args, stream);
}

}  // namespace hisparse::kernels
