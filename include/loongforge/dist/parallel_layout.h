// ParallelLayout: the arithmetic of Megatron-style parallelism. From the world size, the sizes of
// the axes (tp, cp, ep, dp, pp) and their order it computes every process group as lists of
// ranks and each rank's coordinates. Pure and cheap (no LibTorch, no processes), so `--dry-run`
// can print the whole layout. It is not the groups themselves: dist::ParallelContext builds those.
#pragma once

#include <array>
#include <string>
#include <vector>

namespace lf::dist {

// Axes of the device mesh. "dp" of the dense layout and "ep" of the expert layout share ranks:
// experts are parallelised within dp x cp (Megatron semantics), so the expert view of the world
// is etp x ep x expert-dp x pp with etp * ep * expert_dp = tp * dp * cp, where etp (the expert
// tensor-parallel size) is tp (the experts split like the dense MLP; ep within dp x cp) or 1 (each
// expert whole on one rank; ep may then span tp ranks too).
enum class Axis { tp, cp, ep, dp, pp };
const char* to_string(Axis axis);

// Every group kind the layout knows, in the order ParallelContext creates them.
//   world      all ranks
//   tp cp dp pp            one axis varies
//   tp-cp      tensor x context (attention with CP all-gathers within it)
//   dp-cp      data x context: where dense gradients are reduced
//   tp-dp-cp   everything but pp (distributed-optimizer sharding over tp as well)
//   mp         model parallel: tp x pp (Megatron's MODEL_PARALLEL group)
//   embedding  first and last stage of each pipeline (tied word embeddings); with pp = 1 the rank
//   ep         expert parallel (token dispatch)
//   expert-dp  expert data parallel: where expert gradients are reduced
//   tp-ep      expert tensor x expert parallel (expert model parallel)
enum class GroupKind {
  world, tp, cp, dp, pp, tp_cp, dp_cp, tp_dp_cp, mp, embedding, ep, expert_dp, tp_ep
};
inline constexpr std::array<GroupKind, 13> kAllGroupKinds = {
    GroupKind::world, GroupKind::tp,       GroupKind::cp,    GroupKind::dp,
    GroupKind::pp,    GroupKind::tp_cp,    GroupKind::dp_cp, GroupKind::tp_dp_cp,
    GroupKind::mp,    GroupKind::embedding, GroupKind::ep,   GroupKind::expert_dp,
    GroupKind::tp_ep};
const char* to_string(GroupKind kind);  // "tp", "dp-cp", "expert-dp", ...

struct ParallelSizes {
  int tp = 1;
  int cp = 1;
  int ep = 1;
  int pp = 1;
  int dp = 0;  // 0: derived as world / (tp * cp * pp); otherwise must equal that
  int etp = 0;  // expert tensor-parallel size: 0 or tp (the default), or 1
};

// A rank's place on each axis. ep_rank / expert_dp_rank come from the expert view.
struct RankCoords {
  int tp = 0, cp = 0, dp = 0, pp = 0, ep = 0, expert_dp = 0;
};

class ParallelLayout {
 public:
  // Megatron's RankGenerator default: tp fastest, then cp, ep, dp, pp.
  static constexpr const char* kDefaultOrder = "tp-cp-ep-dp-pp";

  // Validates and computes every group. Throws lf::Error naming the clashing values and the world
  // size. `order` lists the axes fastest first, separated by '-'; "ep" may be left out (it is
  // then placed just before "dp").
  ParallelLayout(int world_size, ParallelSizes sizes, std::string order = kDefaultOrder);

  int world_size() const { return world_size_; }
  int size(Axis axis) const;
  int expert_dp_size() const { return expert_dp_; }
  int expert_tp_size() const { return etp_; }

  // The expert view as a layout of its own, for a ParallelContext of the experts: its tp axis is
  // the expert-parallel axis (expert TP = tp > 1: tp x ep as one axis, tp fastest), its dp axis
  // expert-dp, its pp the same stages (cp 1).
  ParallelLayout expert_layout() const;
  // Why expert_layout() would fail (an order that cannot number tp x ep as one axis); "" if not.
  std::string expert_layout_problem() const;
  const std::string& order() const { return order_string_; }

  // All groups of one kind (each a list of ranks in group-rank order). The groups of a kind are
  // disjoint; together they cover the world, except embedding groups, which leave out the middle
  // pipeline stages.
  const std::vector<std::vector<int>>& groups(GroupKind kind) const;
  // The group of `kind` that contains `rank`, or empty if it is in none (embedding only).
  const std::vector<int>& group_of(GroupKind kind, int rank) const;
  // Index of that group within groups(kind), or -1.
  int group_index(GroupKind kind, int rank) const;

  RankCoords coords(int rank) const;

  // A table of the sizes, every group with its ranks, and every rank's coordinates.
  std::string describe() const;

 private:
  int world_size_;
  int tp_, cp_, ep_, dp_, pp_, expert_dp_, etp_;
  std::string order_string_;
  std::vector<Axis> order_;  // fastest first
  std::array<std::vector<std::vector<int>>, kAllGroupKinds.size()> groups_;
  std::array<std::vector<int>, kAllGroupKinds.size()> index_of_rank_;  // [kind][rank] -> group
};

}  // namespace lf::dist
