// Delayed FP8 scaling (Transformer Engine's DelayedScaling recipe; Megatron's --fp8-recipe delayed
// with --fp8-amax-history-len and --fp8-amax-compute-algo). Every operand of an FP8 GEMM (the
// input, the weight and the output gradient of each weight's GEMM; of each expert's for the
// grouped experts) is quantized with a scale that comes from the amaxes of earlier steps, not
// from the tensor itself: the GEMMs reduce nothing over TP, and a tensor that outgrows its history
// saturates.
//
// The history records one amax per step: the maximum over the step's micro-batches (and their
// recomputed forwards) and, in update() at the step's end, over the ranks that hold the same
// weights (the trainer's choice: a parameter group's TP x DP x CP ranks; for experts spread over
// expert-parallel ranks, expert-DP and the TP ranks the experts are split over), so that every one
// of those layouts equals one process. update() then sets
//   scale = 2^-margin fp8_max / amax,  amax = the newest entry (most_recent) or the history's max,
// keeping the previous scale where that amax is 0 or not finite. Scales start at 1. Unlike
// Transformer Engine, which updates after each micro-batch's forward and backward, the scales are
// constant within a step, so a step's result does not depend on how it is split into micro-batches.
//
// State: per parameter group, history fp32 [len, n] (row 0: the current step's amax so far, then
// the older steps, oldest first) and scale fp32 [n], three entries per 2-d weight (input, weight,
// output gradient) and three per group of a 3-d (grouped) weight [G, out, in]. Checkpoints store
// each used weight's rows under its name (TP/DP-replicated values: any layout loads them).
//
// Expert parallelism: a rank's expert weight [G/ep, out, in] holds experts r G/ep .. (r+1) G/ep - 1;
// its entry is part r of ep of the whole weight's (Fp8Weight::parts / part), reduced over the ranks
// that hold the same experts (expert-DP, and TP when the experts are split over it), and stored as
// that part of the whole weight's columns, so that any EP layout loads it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "loongforge/backend/fp8.h"

namespace lf::backend {
class Communicator;
}

namespace lf::ops {

// A weight that gets scales: its name, tensor, and which part of the whole weight's entry it is
// (experts over expert-parallel ranks: part `part` of `parts` along the experts; else 1 of 1).
struct Fp8Weight {
  std::string name;
  at::Tensor tensor;
  int64_t parts = 1, part = 0;
};

// One parameter group's scales and histories.
class Fp8AmaxTable {
 public:
  // The 2-d and 3-d tensors of `weights` (others are skipped), reduced over each of `groups` in
  // turn (none: this rank alone).
  Fp8AmaxTable(const Fp8Recipe& recipe, const std::vector<Fp8Weight>& weights,
               std::vector<lf::backend::Communicator*> groups);
  struct Entry {
    std::string name;
    int64_t offset = 0, width = 0;  // columns [offset, offset + width) of history and scale
    int64_t parts = 1, part = 0;    // the columns are part `part` of `parts` of the whole weight's
  };
  const std::vector<Entry>& entries() const { return entries_; }
  const at::Tensor& history() const { return history_; }
  const at::Tensor& scale() const { return scale_; }
  // Collective over the groups: the current row's maximum over them, new scales, the history rolled.
  void update();
  // Entries that have recorded an amax or hold a scale other than 1 (what a checkpoint stores).
  std::vector<const Entry*> used() const;
  // An entry's rows and scales (CPU copies: this rank's part), and setting them from the whole
  // weight's (e.g. a checkpoint's; this rank takes its part): history must be
  // [len, width x parts], scale [width x parts]; otherwise an lf::Error naming `source` and the entry.
  std::pair<at::Tensor, at::Tensor> state(const Entry& e) const;
  void set_state(const Entry& e, const at::Tensor& history, const at::Tensor& scale, const std::string& source);
  // A resumed run: the table's state came from `source` (set_state for the entries it held). The
  // entries that record an amax in the first step after it and got no state from it (none, or an
  // entry stored unused: no amax, scale 1) are weights new to FP8 since the checkpoint was saved
  // (e.g. layers --first-last-layers-bf16 kept out then): their scales start at 1.
  // take_recorded_without_state() names them once (this rank's records, before update() reduces
  // them) and ends the check; Fp8DelayedScaling::update() warns with them.
  void expect_state_from(const std::string& source);
  std::vector<std::string> take_recorded_without_state();

 private:
  friend class Fp8DelayedScaling;
  Fp8Recipe recipe_;
  std::vector<lf::backend::Communicator*> groups_;
  std::vector<Entry> entries_;
  at::Tensor history_, scale_, fp8_max_;
  std::vector<bool> loaded_;      // per entry: set_state reached it
  std::string expected_source_;   // expect_state_from's, until the check ran
};

// The run's tables (one per parameter group) and the lookup of a GEMM's entry by its weight.
class Fp8DelayedScaling {
 public:
  explicit Fp8DelayedScaling(const Fp8Recipe& recipe);
  // A table for one parameter group; returned for the checkpoint's use. A weight given twice
  // (the same storage, e.g. a tied copy) keeps its first entry.
  Fp8AmaxTable& add_group(const std::vector<Fp8Weight>& weights, std::vector<lf::backend::Communicator*> groups);
  // A GEMM's columns: weight w's entry (group g of a grouped weight: columns 3g..3g+2).
  struct Site {
    Fp8AmaxTable* table = nullptr;
    int64_t offset = 0;
    at::Tensor scale(int64_t column) const;  // fp32 [1], a view into the table
    // history[0, column] = max(history[0, column], amax of x).
    void record(int64_t column, const at::Tensor& x) const;
  };
  // Throws (lf::Error) for a tensor no table holds.
  Site site(const at::Tensor& w) const;
  // Every table's update(), in order: collective over each table's group. The first after a
  // resume (Fp8AmaxTable::expect_state_from) first warns naming the weights that ran in FP8 with
  // no state in the checkpoint.
  void update();
  const std::vector<std::unique_ptr<Fp8AmaxTable>>& tables() const { return tables_; }
  const Fp8Recipe& recipe() const { return recipe_; }

 private:
  Fp8Recipe recipe_;
  std::vector<std::unique_ptr<Fp8AmaxTable>> tables_;
  // The weights (handles: their storage may move, e.g. into a flat buffer, after add_group) and
  // the lookup by storage (-> index into weights_), rebuilt from them when a GEMM's weight is not
  // found or the entry found is stale (its weight has moved and another took the address).
  struct Weight {
    at::Tensor tensor;
    Fp8AmaxTable* table;
    int64_t offset;
  };
  std::vector<Weight> weights_;
  mutable std::unordered_map<const void*, size_t> by_data_;
  void reindex() const;
};

}  // namespace lf::ops
