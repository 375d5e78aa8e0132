// ParallelContext: the process groups of one parallel layout, as seen by this rank, plus its
// coordinates. Built explicitly and passed to whatever needs groups; there is no global instance,
// and several may coexist (a VLM's encoder and decoder, each over its own set of ranks). It does
// not decide the layout (dist::ParallelLayout does) nor move tensors (backend::Communicator does).
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loongforge/backend/communicator.h"
#include "loongforge/dist/parallel_layout.h"

namespace lf::dist {

class Rendezvous;

using CommunicatorFactory =
    std::function<std::unique_ptr<backend::Communicator>(const backend::CommunicatorSpec&)>;

struct ParallelContextOptions {
  // Names the context in store keys ("<name>/<kind>/<index>") and in group names ("<name>/tp")
  // unless it is "default". Unique among the contexts built on one store.
  std::string name = "default";
  // Global ranks that form this context's world, in layout-rank order; empty: all ranks.
  std::vector<int> world_ranks;
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  // Builds one group's communicator; empty: Gloo with shared-memory collectives among the
  // ranks of one host (backend::make_cpu_communicator).
  CommunicatorFactory factory;
  // Group kinds to create; empty: all of kAllGroupKinds. Only created kinds can be accessed.
  std::vector<GroupKind> kinds;
};

class ParallelContext {
 public:
  // Every rank of options.world_ranks must build the same context (same layout, name, kinds) at
  // the same point: creating groups connects their members. Ranks outside world_ranks must not.
  ParallelContext(int global_rank, int global_world_size, c10::intrusive_ptr<c10d::Store> store,
                  ParallelLayout layout, ParallelContextOptions options = {});
  // Uses the rendezvous' rank, world, store and, for the default Gloo factory, MASTER_ADDR.
  ParallelContext(const Rendezvous& rendezvous, ParallelLayout layout,
                  ParallelContextOptions options = {});
  ~ParallelContext();
  ParallelContext(const ParallelContext&) = delete;
  ParallelContext& operator=(const ParallelContext&) = delete;

  const std::string& name() const { return name_; }
  const ParallelLayout& layout() const { return layout_; }
  int rank() const { return rank_; }  // rank within this context's world (the layout's rank)
  int global_rank() const { return global_rank_; }
  int world_size() const { return layout_.world_size(); }
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  const RankCoords& coords() const { return coords_; }

  // The group of `kind` this rank belongs to. Throws lf::Error if the kind was not created or
  // this rank is in no group of it (a middle pipeline stage and the embedding group).
  backend::Communicator& group(GroupKind kind) const;
  bool has(GroupKind kind) const;

  backend::Communicator& world() const { return group(GroupKind::world); }
  backend::Communicator& tp() const { return group(GroupKind::tp); }
  backend::Communicator& cp() const { return group(GroupKind::cp); }
  backend::Communicator& dp() const { return group(GroupKind::dp); }
  backend::Communicator& pp() const { return group(GroupKind::pp); }
  backend::Communicator& tp_cp() const { return group(GroupKind::tp_cp); }
  backend::Communicator& dp_cp() const { return group(GroupKind::dp_cp); }
  backend::Communicator& tp_dp_cp() const { return group(GroupKind::tp_dp_cp); }
  backend::Communicator& mp() const { return group(GroupKind::mp); }
  backend::Communicator& embedding() const { return group(GroupKind::embedding); }
  backend::Communicator& ep() const { return group(GroupKind::ep); }
  backend::Communicator& expert_dp() const { return group(GroupKind::expert_dp); }
  backend::Communicator& tp_ep() const { return group(GroupKind::tp_ep); }

  int tp_rank() const { return coords_.tp; }
  int cp_rank() const { return coords_.cp; }
  int dp_rank() const { return coords_.dp; }
  int pp_rank() const { return coords_.pp; }
  int ep_rank() const { return coords_.ep; }
  int expert_dp_rank() const { return coords_.expert_dp; }
  int tp_size() const { return layout_.size(Axis::tp); }
  int cp_size() const { return layout_.size(Axis::cp); }
  int dp_size() const { return layout_.size(Axis::dp); }
  int pp_size() const { return layout_.size(Axis::pp); }
  int ep_size() const { return layout_.size(Axis::ep); }
  bool is_first_stage() const { return coords_.pp == 0; }
  bool is_last_stage() const { return coords_.pp == pp_size() - 1; }
  bool in_embedding_group() const { return has(GroupKind::embedding); }

  // Global rank of the previous / next pipeline stage of this rank's pipeline (wrapping).
  int prev_stage_rank() const;
  int next_stage_rank() const;

 private:
  std::string name_;
  ParallelLayout layout_;
  std::vector<int> world_ranks_;
  int global_rank_;
  int rank_;
  RankCoords coords_;
  // Kinds whose groups equal an earlier kind's (e.g. tp-cp when cp = 1) share its communicator.
  std::array<std::shared_ptr<backend::Communicator>, kAllGroupKinds.size()> groups_;
  std::array<bool, kAllGroupKinds.size()> created_{};
};

}  // namespace lf::dist
