// ParallelContext (see parallel_context.h). Group creation order is the same on every rank:
// kinds in kAllGroupKinds order, groups of a kind by index, so each Gloo full-mesh connect finds
// all its members; a rank skips the groups it is not in (groups of one kind are disjoint, so no
// rank waits on a group its peers have not reached).
#include "loongforge/dist/parallel_context.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>

#include "loongforge/backend/shm_communicator.h"
#include "loongforge/core/error.h"
#include "loongforge/dist/rendezvous.h"

namespace lf::dist {
namespace {

std::vector<int> all_ranks(int n) {
  std::vector<int> r(n);
  for (int i = 0; i < n; ++i) r[i] = i;
  return r;
}

}  // namespace

ParallelContext::ParallelContext(const Rendezvous& rendezvous, ParallelLayout layout,
                                 ParallelContextOptions options)
    : ParallelContext(rendezvous.rank(), rendezvous.world_size(), rendezvous.store(),
                      std::move(layout), [&] {
                        if (!options.factory) {
                          backend::GlooOptions gloo;
                          gloo.master_addr = rendezvous.env().master_addr;
                          options.factory = [gloo](const backend::CommunicatorSpec& spec) {
                            return backend::make_cpu_communicator(spec, gloo);
                          };
                        }
                        return std::move(options);
                      }()) {}

ParallelContext::ParallelContext(int global_rank, int global_world_size,
                                 c10::intrusive_ptr<c10d::Store> store, ParallelLayout layout,
                                 ParallelContextOptions options)
    : name_(options.name), layout_(std::move(layout)),
      world_ranks_(options.world_ranks.empty() ? all_ranks(global_world_size)
                                               : options.world_ranks),
      global_rank_(global_rank) {
  LF_CHECK(store, "parallel context '", name_, "' needs a store (from dist::Rendezvous)");
  LF_CHECK(static_cast<int>(world_ranks_.size()) == layout_.world_size(), "parallel context '",
           name_, "' spans ", world_ranks_.size(), " ranks but its layout has world size ",
           layout_.world_size(),
           lf::hint("the layout's world size must equal the number of ranks in world_ranks"));
  for (int r : world_ranks_)
    LF_CHECK(r >= 0 && r < global_world_size &&
                 std::count(world_ranks_.begin(), world_ranks_.end(), r) == 1,
             "parallel context '", name_, "': world rank ", r,
             " is out of range or listed twice (global world size ", global_world_size, ")");
  auto self = std::find(world_ranks_.begin(), world_ranks_.end(), global_rank);
  LF_CHECK(self != world_ranks_.end(), "rank ", global_rank, " builds parallel context '", name_,
           "' but is not one of its ranks",
           lf::hint("only the ranks in world_ranks construct a context over a sub-world"));
  rank_ = static_cast<int>(self - world_ranks_.begin());
  coords_ = layout_.coords(rank_);
  LF_CHECK(options.timeout.count() > 0, "parallel context '", name_, "': timeout must be > 0");

  CommunicatorFactory factory = options.factory;
  if (!factory) factory = [](const backend::CommunicatorSpec& s) {
    return backend::make_cpu_communicator(s);
  };
  std::vector<GroupKind> kinds = options.kinds;
  if (kinds.empty()) kinds.assign(kAllGroupKinds.begin(), kAllGroupKinds.end());
  const std::string prefix = name_ == "default" ? "" : name_ + "/";

  for (GroupKind kind : kAllGroupKinds) {
    if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) continue;
    const size_t k = static_cast<size_t>(kind);
    created_[k] = true;
    // Decided from the layout alone, so every rank aliases the same kinds.
    bool aliased = false;
    for (GroupKind earlier : kAllGroupKinds) {
      if (earlier == kind) break;
      const size_t e = static_cast<size_t>(earlier);
      if (created_[e] && layout_.groups(earlier) == layout_.groups(kind)) {
        groups_[k] = groups_[e];
        aliased = true;
        break;
      }
    }
    if (aliased) continue;
    const auto& list = layout_.groups(kind);
    const int index = layout_.group_index(kind, rank_);
    if (index < 0) continue;
    backend::CommunicatorSpec spec;
    spec.name = prefix + to_string(kind);
    for (int r : list[index]) spec.ranks.push_back(world_ranks_[r]);
    spec.group_rank = static_cast<int>(
        std::find(list[index].begin(), list[index].end(), rank_) - list[index].begin());
    spec.global_rank = global_rank;
    spec.timeout = options.timeout;
    spec.store = c10::make_intrusive<c10d::PrefixStore>(
        "lf/" + prefix + to_string(kind) + "/" + std::to_string(index), store);
    groups_[k] = std::shared_ptr<backend::Communicator>(factory(spec));
    LF_CHECK(groups_[k], "the communicator factory returned nothing for group '", spec.name, "'");
  }
}

ParallelContext::~ParallelContext() = default;

bool ParallelContext::has(GroupKind kind) const {
  return groups_[static_cast<size_t>(kind)] != nullptr;
}

backend::Communicator& ParallelContext::group(GroupKind kind) const {
  const size_t k = static_cast<size_t>(kind);
  LF_CHECK(created_[k], "parallel context '", name_, "' did not create the '", to_string(kind),
           "' groups", lf::hint("add the kind to ParallelContextOptions::kinds"));
  LF_CHECK(groups_[k], "rank ", global_rank_, " (pipeline stage ", coords_.pp, " of ", pp_size(),
           ") is in no '", to_string(kind), "' group of parallel context '", name_, "'",
           lf::hint("only the first and last pipeline stages hold an embedding group; check "
                    "in_embedding_group()"));
  return *groups_[k];
}

int ParallelContext::prev_stage_rank() const {
  const auto& p = layout_.group_of(GroupKind::pp, rank_);
  return world_ranks_[p[(coords_.pp + pp_size() - 1) % pp_size()]];
}

int ParallelContext::next_stage_rank() const {
  const auto& p = layout_.group_of(GroupKind::pp, rank_);
  return world_ranks_[p[(coords_.pp + 1) % pp_size()]];
}

}  // namespace lf::dist
