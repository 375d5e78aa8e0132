// FP8 linear layers (Transformer Engine's and Megatron's --fp8-format / --fp8-recipe) and the
// adaptive FP8 policy (per GEMM kind and token count, FP8 or not, read from a file a benchmark
// wrote). Recipes:
//  - tensorwise (current scaling): one scale per tensor, scale = 2^-margin fp8_max / amax of the
//    tensor being quantized; under tensor parallelism the amax is the maximum over the TP group,
//    so a shard is quantized as the full tensor would be;
//  - blockwise (DeepSeek-V3's): inputs and output gradients in 1 x 128 tiles along each GEMM's
//    reduction dimension, weights in 128 x 128 blocks, each with its own scale;
//  - delayed (Transformer Engine's DelayedScaling): one scale per tensor from the amax history of
//    earlier steps (backend/fp8_delayed.h), so the GEMMs reduce nothing over TP;
//  - mxfp8 (OCP microscaling, Transformer Engine's MXFP8BlockScaling): every operand in blocks of
//    32 consecutive values along its GEMM's reduction dimension (so the weight is quantized twice:
//    along its input dim for the forward, along its output dim for the input gradient), each
//    block's scale a power of two (E8M0): 2^-ceil(log2(2^margin amax / fp8_max)).
// Formats: e4m3 (everything E4M3) or hybrid (E4M3 forward, E5M2 for output gradients).
//
// Every GEMM of a layer (forward, input gradient, weight gradient) multiplies quantized operands
// and accumulates in fp32, as the FP8 tensor cores do. Tensorwise GEMMs are ATen's _scaled_mm on
// the FP8 tensors (cuBLASLt on CUDA; on the CPU ATen's kernel, which converts and is no faster
// than fp32); blockwise and MX GEMMs, and CUDA shapes cuBLASLt does not take (k or n not a multiple
// of 16), multiply the operands dequantized to fp32 (an FP8 value times its fp32 scale): the same
// products, fp32 accumulation in another order.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "loongforge/backend/functional.h"

namespace lf::backend {
class Communicator;
}

namespace lf::ops {

class Fp8DelayedScaling;

enum class Fp8Scaling { tensorwise, blockwise, delayed, mxfp8 };
enum class Fp8Format { e4m3, hybrid };
// Delayed scaling: the amax a scale comes from, the history's newest entry or its maximum.
enum class Fp8AmaxAlgo { most_recent, max };

struct Fp8Recipe {
  static constexpr int64_t kBlock = 128;   // blockwise tile / block edge
  static constexpr int64_t kMxBlock = 32;  // mxfp8 block
  Fp8Scaling scaling = Fp8Scaling::tensorwise;
  Fp8Format format = Fp8Format::hybrid;
  int margin = 0;  // scales are 2^-margin fp8_max / amax
  // Delayed scaling only (Megatron's --fp8-amax-history-len, --fp8-amax-compute-algo).
  int64_t amax_history_len = 1;
  Fp8AmaxAlgo amax_compute_algo = Fp8AmaxAlgo::most_recent;
  // Delayed scaling: the run's scales and amax histories (not owned; a delayed GEMM without them
  // throws). Not part of the recipe's identity (operator==).
  Fp8DelayedScaling* delayed = nullptr;
  at::ScalarType forward_dtype() const;  // E4M3 (inputs and weights)
  at::ScalarType grad_dtype() const;     // E5M2 under hybrid, else E4M3 (output gradients)
  std::string describe() const;          // "tensorwise hybrid (margin 0)", "delayed ... history 16, max"
  // From the flags' names ("e4m3" / "hybrid", "tensorwise" / "blockwise" / "delayed" / "mxfp8",
  // "most_recent" / "max"); another name throws. history_len and algo matter only for delayed.
  static Fp8Recipe from_names(const std::string& format, const std::string& scaling, int margin,
                              int64_t history_len = 1, const std::string& algo = "most_recent");
  bool operator==(const Fp8Recipe& o) const {
    return scaling == o.scaling && format == o.format && margin == o.margin &&
           (scaling != Fp8Scaling::delayed ||
            (amax_history_len == o.amax_history_len && amax_compute_algo == o.amax_compute_algo));
  }
};
const char* to_string(Fp8Scaling s);
const char* to_string(Fp8Format f);
const char* to_string(Fp8AmaxAlgo a);

// The largest finite value of an FP8 dtype: 448 (E4M3, "fn"), 57344 (E5M2).
double fp8_max(at::ScalarType fp8);

// A 2-d tensor in FP8 with one fp32 scale per tile_rows x tile_cols tile (the last tiles may be
// partial): value = data * scale_inv.
struct Fp8Tensor {
  at::Tensor data;       // [rows, cols], the FP8 dtype
  at::Tensor scale_inv;  // fp32 [ceil(rows / tile_rows), ceil(cols / tile_cols)]
  int64_t tile_rows = 0, tile_cols = 0;
  at::Tensor dequantize() const;  // fp32 [rows, cols]
};

// The absolute maximum of each tile of x [rows, cols] (fp32 [ceil(rows / tr), ceil(cols / tc)]);
// tr = tc = 0 means the whole tensor (one tile).
at::Tensor tile_amax(const at::Tensor& x, int64_t tr, int64_t tc);
// x [rows, cols] (any floating dtype) in `fp8` (kFloat8_e4m3fn or kFloat8_e5m2), one scale per
// tile (tr = tc = 0: one for the whole tensor): scale = 2^-margin fp8_max / amax (1 where the amax
// is 0), data = saturate(x scale) rounded to nearest even. `amax` (tile_amax's shape) replaces
// the tiles' own, e.g. one reduced over a TP group. pow2 (MX's E8M0 scales): scale = 1 / the
// smallest power of two >= 2^margin amax / fp8_max, so that no value saturates.
Fp8Tensor quantize(const at::Tensor& x, at::ScalarType fp8, int64_t tr, int64_t tc, int margin,
                   const at::Tensor& amax = {}, bool pow2 = false);
// x in `fp8` with a given scale (fp32, one element; delayed scaling's): data = saturate(x scale)
// rounded to nearest even, scale_inv = 1 / scale, one tile.
Fp8Tensor quantize_scaled(const at::Tensor& x, at::ScalarType fp8, const at::Tensor& scale);

// y = x w^T (+ b) with each GEMM in FP8 under `recipe`: x [.., in], w [out, in], b [out] or
// undefined; y and x's gradient in x's dtype, b's in b's. w's gradient (fp32 GEMM result) goes to
// the slot slots->weight_grad_slot(w) names when there is one (gradient-accumulation fusion), else
// to autograd in w's dtype. amax_group (tensorwise only; null: none): the TP group over which x,
// w and the output gradient are shards of one tensor, whose amax is reduced (max) over it, so that
// TP equals one process. The backward keeps the FP8 copies of x and w, not x. Delayed scaling: the
// scales are recipe.delayed's for w (a weight it was given), and this call's amax of x, w and the
// output gradient go into its history when gradients are recorded (not in evaluation).
at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b, const Fp8Recipe& recipe,
                      const WeightGradSlots* slots, lf::backend::Communicator* amax_group);

// The experts' grouped GEMM in FP8: x [m, in] in groups of counts [G] rows (int64), w [G, out, in]
// -> [m, out], row group g times w[g]^T, each group's GEMMs FP8 GEMMs with their own scales (as
// lf::ops::grouped_gemm in the training dtype); gradients to x and w through autograd.
// amax_group as fp8_linear's (the TP group when the experts are split over TP).
at::Tensor fp8_grouped_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& counts,
                              const Fp8Recipe& recipe, lf::backend::Communicator* amax_group);

// The linear layers of a transformer layer the FP8 policy chooses for.
enum class Fp8Gemm { qkv, proj, fc1, fc2 };
const char* to_string(Fp8Gemm g);
inline constexpr Fp8Gemm kFp8Gemms[] = {Fp8Gemm::qkv, Fp8Gemm::proj, Fp8Gemm::fc1, Fp8Gemm::fc2};

// Which GEMMs run in FP8: all of them (no policy file), or per GEMM kind by token count (the
// adaptive policy: a benchmark, loongforge-fp8-policy, times each kind in FP8 and in the training
// dtype at several token counts and writes the faster choice).
class Fp8Policy {
 public:
  // From min_tokens on (until the next step's), FP8 or not.
  struct Step {
    int64_t min_tokens = 0;
    bool fp8 = true;
    bool operator==(const Step&) const = default;
  };
  // What the benchmark measured (written to the file for the reader; not read back).
  struct Measurement {
    Fp8Gemm gemm;
    int64_t tokens;
    double base_ms, fp8_ms;
  };
  explicit Fp8Policy(Fp8Recipe recipe) : recipe_(recipe) {}  // every GEMM in FP8
  // The policy file `path` (JSON), for a run under `recipe`: refused (lf::Error naming the file and
  // the key) when malformed, with a key it does not know, missing a GEMM kind, or measured for
  // another recipe, format or margin.
  static Fp8Policy read(const std::string& path, const Fp8Recipe& recipe);
  // The benchmark's choice: for each GEMM kind, FP8 at a measured token count where fp8_ms <
  // base_ms; that choice holds from that count up to the next measured one (below the smallest,
  // the smallest's). Every kind must have measurements.
  static Fp8Policy from_measurements(const Fp8Recipe& recipe, const std::vector<Measurement>& measurements);
  void set_steps(Fp8Gemm g, std::vector<Step> steps);  // checked as read() checks a file's
  void write(const std::string& path, const std::string& measured_on,
             const std::vector<Measurement>& measurements) const;
  // The recipe for gemm at `tokens` rows (this rank's GEMM rows), or null: not in FP8.
  const Fp8Recipe* choose(Fp8Gemm gemm, int64_t tokens) const;
  const Fp8Recipe& recipe() const { return recipe_; }
  // Delayed scaling: the state the recipe's GEMMs use (not owned; see Fp8Recipe::delayed).
  void set_delayed(Fp8DelayedScaling* state) { recipe_.delayed = state; }
  // Megatron's --first-last-layers-bf16: the first `first` and last `last` transformer layers of
  // the model keep every GEMM in the training dtype.
  void set_layers_in_training_dtype(int64_t first, int64_t last);
  int64_t first_layers_in_training_dtype() const { return first_; }
  int64_t last_layers_in_training_dtype() const { return last_; }
  // Of a model's n layers (decoder layers, DiT blocks: `unit`, e.g. "layers"), which follow this
  // policy: all but the first/last counts. Counts beyond n throw naming the flags.
  std::vector<bool> layers_in_fp8(int64_t n, const std::string& unit) const;
  const std::string& source() const { return source_; }  // the file, or "" (all FP8)
  std::string describe() const;                           // one line per GEMM kind with steps

 private:
  Fp8Recipe recipe_;
  std::string source_;
  std::map<Fp8Gemm, std::vector<Step>> steps_;  // absent: FP8 at every token count
  int64_t first_ = 0, last_ = 0;
};

}  // namespace lf::ops
