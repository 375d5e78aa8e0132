// Per-region random streams for tensor parallelism (Megatron's CudaRNGStatesTracker, on explicit
// CPU generators instead of swapped global state). Dropout on tensors that are replicated over
// the TP group must draw the same mask on every TP rank; dropout on tensors that are split over
// TP (attention heads, sequence-parallel chunks) must draw different masks per TP rank. Not the
// initialisation RNG: parameters are drawn once from the model seed and then sharded.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>

namespace lf::parallel {

class RngTracker {
 public:
  // The stream for replicated regions: identical on every TP rank (seed + 100 * pp_rank, as
  // Megatron's default generator). The name of the stream for TP-split regions:
  static constexpr const char* kDefault = "default";
  static constexpr const char* kModelParallel = "model-parallel-rng";
  // Megatron's offset: the TP-split stream is seeded seed + 2718 + tp_rank (+ 100 * pp_rank).
  static constexpr uint64_t kModelParallelOffset = 2718;

  RngTracker() = default;
  // Both streams for this rank.
  RngTracker(uint64_t seed, int tp_rank, int pp_rank = 0);

  // Adds a named stream; a name or seed used twice is an error (two streams that silently
  // coincide would correlate masks that must be independent).
  void add(const std::string& name, uint64_t seed);
  bool has(const std::string& name) const { return streams_.count(name) > 0; }
  at::Generator& get(const std::string& name);
  uint64_t seed(const std::string& name) const;
  // Every stream's generator state (uint8 CPU tensors, ATen's format), for checkpoints and for
  // replaying dropout masks in recomputation; set_state restores exactly these streams (a name
  // this tracker lacks, or a missing one, is an error).
  std::map<std::string, at::Tensor> state() const;
  void set_state(const std::map<std::string, at::Tensor>& state);

 private:
  struct Stream {
    uint64_t seed;
    at::Generator gen;
  };
  std::map<std::string, Stream> streams_;
};

// Inverted dropout drawing its mask from `gen`: x * mask / (1 - p); identity when p == 0.
// Differentiable through ATen (the mask is a constant of the graph).
at::Tensor dropout(const at::Tensor& x, double p, at::Generator& gen);

}  // namespace lf::parallel
