// ParallelLayout (see parallel_layout.h). Ranks are a mixed-radix number over the axes in the
// configured order, fastest axis first (rank = c0 + s0 * (c1 + s1 * (c2 + ...))). A group of kind K
// holds the ranks that differ only on K's axes; this is Megatron's
// generate_masked_orthogonal_rank_groups, so the groups match Megatron's for the same order.
#include "loongforge/dist/parallel_layout.h"

#include <algorithm>
#include <iomanip>
#include <sstream>

#include "loongforge/core/error.h"
#include "loongforge/core/strings.h"

namespace lf::dist {
namespace {

constexpr std::array<Axis, 5> kAxes = {Axis::tp, Axis::cp, Axis::ep, Axis::dp, Axis::pp};

size_t kind_index(GroupKind k) { return static_cast<size_t>(k); }

// sizes[i] is the size of the i-th axis of the order (fastest first); mask[i] marks the axes
// that vary within a group. Groups are listed with the first unmasked axis fastest and ranks
// inside a group with the first masked axis fastest.
std::vector<std::vector<int>> masked_groups(const std::vector<int>& sizes,
                                            const std::vector<bool>& mask) {
  std::vector<int> stride(sizes.size());
  int s = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    stride[i] = s;
    s *= sizes[i];
  }
  std::vector<size_t> in, out;
  int group_size = 1, num_groups = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (mask[i]) {
      in.push_back(i);
      group_size *= sizes[i];
    } else {
      out.push_back(i);
      num_groups *= sizes[i];
    }
  }
  auto offset = [&](int index, const std::vector<size_t>& axes) {
    int r = 0;
    for (size_t a : axes) {
      r += (index % sizes[a]) * stride[a];
      index /= sizes[a];
    }
    return r;
  };
  std::vector<std::vector<int>> groups(num_groups);
  for (int g = 0; g < num_groups; ++g) {
    int base = offset(g, out);
    for (int m = 0; m < group_size; ++m) groups[g].push_back(base + offset(m, in));
  }
  return groups;
}

std::string join(const std::vector<int>& v) { return lf::bracket_list(v); }

}  // namespace

const char* to_string(Axis axis) {
  switch (axis) {
    case Axis::tp: return "tp";
    case Axis::cp: return "cp";
    case Axis::ep: return "ep";
    case Axis::dp: return "dp";
    case Axis::pp: return "pp";
  }
  return "?";
}

const char* to_string(GroupKind kind) {
  switch (kind) {
    case GroupKind::world: return "world";
    case GroupKind::tp: return "tp";
    case GroupKind::cp: return "cp";
    case GroupKind::dp: return "dp";
    case GroupKind::pp: return "pp";
    case GroupKind::tp_cp: return "tp-cp";
    case GroupKind::dp_cp: return "dp-cp";
    case GroupKind::tp_dp_cp: return "tp-dp-cp";
    case GroupKind::mp: return "mp";
    case GroupKind::embedding: return "embedding";
    case GroupKind::ep: return "ep";
    case GroupKind::expert_dp: return "expert-dp";
    case GroupKind::tp_ep: return "tp-ep";
  }
  return "?";
}

ParallelLayout::ParallelLayout(int world_size, ParallelSizes sizes, std::string order)
    : world_size_(world_size), tp_(sizes.tp), cp_(sizes.cp), ep_(sizes.ep), pp_(sizes.pp),
      order_string_(std::move(order)) {
  LF_CHECK(world_size >= 1, "world size ", world_size, " must be >= 1");
  for (auto [name, v] : {std::pair{"tensor-model-parallel size (tp)", tp_},
                         std::pair{"context-parallel size (cp)", cp_},
                         std::pair{"expert-model-parallel size (ep)", ep_},
                         std::pair{"pipeline-model-parallel size (pp)", pp_}})
    LF_CHECK(v >= 1, name, " is ", v, "; every parallel size must be >= 1 (world size ",
             world_size, ")");
  const int model = tp_ * cp_ * pp_;
  LF_CHECK(world_size % model == 0, "world size ", world_size,
           " is not divisible by tp * cp * pp = ", tp_, " * ", cp_, " * ", pp_, " = ", model,
           lf::hint("choose sizes whose product divides the number of processes; dp is derived "
                    "as world / (tp * cp * pp)"));
  dp_ = world_size / model;
  LF_CHECK(sizes.dp == 0 || sizes.dp == dp_, "data-parallel size dp=", sizes.dp,
           " does not match world / (tp * cp * pp) = ", world_size, " / ", model, " = ", dp_,
           lf::hint("leave dp unset (0) to derive it"));
  etp_ = sizes.etp == 0 ? tp_ : sizes.etp;
  LF_CHECK(etp_ == tp_ || etp_ == 1, "expert tensor-parallel size etp=", etp_, " must be 1 or tp=", tp_,
           lf::hint("--expert-tensor-parallel-size 1 keeps every expert whole on one rank; leave it unset to split "
                    "the experts over the tensor-parallel group like the dense MLP"));
  if (etp_ == tp_) {
    LF_CHECK((dp_ * cp_) % ep_ == 0, "expert-model-parallel size ep=", ep_,
             " does not divide dp * cp = ", dp_, " * ", cp_, " = ", dp_ * cp_, " (world size ",
             world_size, ", tp=", tp_, ", cp=", cp_, ", pp=", pp_, ")",
             lf::hint("experts are parallelised within data x context parallel ranks; pick ep "
                      "dividing dp * cp (or --expert-tensor-parallel-size 1: ep dividing tp * dp * cp)"));
    expert_dp_ = dp_ * cp_ / ep_;
  } else {
    LF_CHECK((tp_ * dp_ * cp_) % ep_ == 0, "expert-model-parallel size ep=", ep_,
             " does not divide tp * dp * cp = ", tp_, " * ", dp_, " * ", cp_, " = ", tp_ * dp_ * cp_,
             " (world size ", world_size, ", pp=", pp_, ", expert tensor-parallel size 1)",
             lf::hint("with expert TP 1 the experts are parallelised within a pipeline stage's ranks; pick ep "
                      "dividing tp * dp * cp"));
    expert_dp_ = tp_ * dp_ * cp_ / ep_;
  }

  // Parse the order: axis names separated by '-', each once; "ep" may be omitted.
  std::vector<std::string> names;
  {
    std::string item;
    std::istringstream is(order_string_);
    while (std::getline(is, item, '-')) names.push_back(item);
  }
  for (const auto& n : names) {
    auto it = std::find_if(kAxes.begin(), kAxes.end(), [&](Axis a) { return n == to_string(a); });
    LF_CHECK(it != kAxes.end(), "parallel order '", order_string_, "' names unknown axis '", n, "'",
             lf::hint("use the axes tp, cp, ep, dp, pp separated by '-', e.g. tp-cp-ep-dp-pp"));
    LF_CHECK(std::find(order_.begin(), order_.end(), *it) == order_.end(), "parallel order '",
             order_string_, "' names axis '", n, "' twice",
             lf::hint("name each of tp, cp, ep, dp, pp once"));
    order_.push_back(*it);
  }
  if (std::find(order_.begin(), order_.end(), Axis::ep) == order_.end()) {
    auto dp = std::find(order_.begin(), order_.end(), Axis::dp);
    if (dp != order_.end()) order_.insert(dp, Axis::ep);
  }
  for (Axis a : kAxes)
    LF_CHECK(std::find(order_.begin(), order_.end(), a) != order_.end(), "parallel order '",
             order_string_, "' lacks axis '", to_string(a), "'",
             lf::hint("name each of tp, cp, dp, pp once (ep optional), e.g. tp-cp-ep-dp-pp"));

  // Dense view: ep has size 1. Expert view: cp has size 1 and dp's place holds expert-dp.
  std::vector<int> dense, expert;
  for (Axis a : order_) {
    dense.push_back(a == Axis::ep ? 1 : size(a));
    expert.push_back(a == Axis::cp ? 1 : a == Axis::dp ? expert_dp_ : a == Axis::tp ? etp_ : size(a));
  }
  auto mask = [&](std::initializer_list<Axis> axes) {
    std::vector<bool> m;
    for (Axis a : order_) m.push_back(std::find(axes.begin(), axes.end(), a) != axes.end());
    return m;
  };
  auto& g = groups_;
  g[kind_index(GroupKind::world)] =
      masked_groups(dense, mask({Axis::tp, Axis::cp, Axis::dp, Axis::pp}));
  g[kind_index(GroupKind::tp)] = masked_groups(dense, mask({Axis::tp}));
  g[kind_index(GroupKind::cp)] = masked_groups(dense, mask({Axis::cp}));
  g[kind_index(GroupKind::dp)] = masked_groups(dense, mask({Axis::dp}));
  g[kind_index(GroupKind::pp)] = masked_groups(dense, mask({Axis::pp}));
  g[kind_index(GroupKind::tp_cp)] = masked_groups(dense, mask({Axis::tp, Axis::cp}));
  g[kind_index(GroupKind::dp_cp)] = masked_groups(dense, mask({Axis::dp, Axis::cp}));
  g[kind_index(GroupKind::tp_dp_cp)] = masked_groups(dense, mask({Axis::tp, Axis::dp, Axis::cp}));
  g[kind_index(GroupKind::mp)] = masked_groups(dense, mask({Axis::tp, Axis::pp}));
  for (const auto& pipeline : g[kind_index(GroupKind::pp)]) {
    if (pipeline.size() == 1) g[kind_index(GroupKind::embedding)].push_back(pipeline);
    else g[kind_index(GroupKind::embedding)].push_back({pipeline.front(), pipeline.back()});
  }
  g[kind_index(GroupKind::ep)] = masked_groups(expert, mask({Axis::ep}));
  g[kind_index(GroupKind::expert_dp)] = masked_groups(expert, mask({Axis::dp}));
  g[kind_index(GroupKind::tp_ep)] = masked_groups(expert, mask({Axis::tp, Axis::ep}));

  for (GroupKind k : kAllGroupKinds) {
    auto& idx = index_of_rank_[kind_index(k)];
    idx.assign(world_size_, -1);
    const auto& list = g[kind_index(k)];
    for (size_t i = 0; i < list.size(); ++i)
      for (int r : list[i]) idx[r] = static_cast<int>(i);
  }

  // The expert view must tile each dense dp x cp block, i.e. agree with the dense view on every
  // rank's tp and pp group; otherwise expert gradients would be reduced across model replicas
  // that hold different layers.
  for (int r = 0; r < world_size_; ++r) {
    // Expert-dp x ep must span exactly the dense dp x cp group of the rank (expert TP 1: the
    // dense tp x dp x cp group, the rank's pipeline stage).
    std::vector<int> block;
    for (int e : group_of(GroupKind::ep, r))
      for (int d : group_of(GroupKind::expert_dp, e)) block.push_back(d);
    std::vector<int> dense_block = group_of(etp_ == tp_ ? GroupKind::dp_cp : GroupKind::tp_dp_cp, r);
    std::sort(block.begin(), block.end());
    std::sort(dense_block.begin(), dense_block.end());
    const auto& tp = group_of(GroupKind::tp, r);
    const auto& tp_ep = group_of(GroupKind::tp_ep, r);
    bool tp_inside = etp_ != tp_ || std::all_of(tp.begin(), tp.end(), [&](int m) {
      return std::find(tp_ep.begin(), tp_ep.end(), m) != tp_ep.end();
    });
    LF_CHECK(block == dense_block && tp_inside, "parallel order '", order_string_, "' (tp=", tp_,
             " cp=", cp_, " ep=", ep_, " dp=", dp_, " pp=", pp_, ", world size ", world_size_,
             ") makes the expert layout disagree with the dense one at rank ", r,
             ": ep x expert-dp ranks ", join(block), " vs ", etp_ == tp_ ? "dp x cp" : "tp x dp x cp", " ranks ",
             join(dense_block), ", tp ranks ", join(tp), " vs tp-ep ranks ", join(tp_ep),
             lf::hint("experts are parallelised within dp x cp; put tp first and ep next to cp "
                      "and dp, e.g. tp-cp-ep-dp-pp"));
  }
}

std::string ParallelLayout::expert_layout_problem() const {
  if (etp_ == 1) return "";
  // Experts split over tp x ep: one tp axis of size tp * ep (tp fastest, as Sharding::outer numbers
  // the ranks). The tp and ep digits must be adjacent in the rank numbering: only axes of size 1
  // in the expert view (cp always) may sit between them.
  const auto ti = std::find(order_.begin(), order_.end(), Axis::tp);
  const auto ei = std::find(order_.begin(), order_.end(), Axis::ep);
  const auto expert_size = [&](Axis a) { return a == Axis::cp ? 1 : a == Axis::dp ? expert_dp_ : size(a); };
  if (ti < ei && std::all_of(ti + 1, ei, [&](Axis a) { return expert_size(a) == 1; })) return "";
  return "parallel order '" + order_string_ + "' puts axes between tp and ep (or ep before tp); experts split " +
         "over tp (expert tensor-parallel size " + std::to_string(etp_) + ") and ep need tp then ep";
}

ParallelLayout ParallelLayout::expert_layout() const {
  if (etp_ > 1) {
    const std::string problem = expert_layout_problem();
    LF_CHECK(problem.empty(), problem,
             lf::hint("use an order such as tp-cp-ep-dp-pp, or --expert-tensor-parallel-size 1"));
    std::string order;
    for (Axis a : order_)
      if (a != Axis::ep) order += (order.empty() ? "" : "-") + std::string(to_string(a));
    ParallelSizes s;
    s.tp = tp_ * ep_;
    s.pp = pp_;
    return ParallelLayout(world_size_, s, order);
  }
  // The same mixed-radix rank numbering with the axes renamed: ep becomes the tp axis, dp holds
  // expert-dp, and the dense tp and cp (size 1 in the expert view) take the unused names.
  std::string order;
  for (Axis a : order_) {
    const char* n = a == Axis::ep ? "tp" : a == Axis::tp ? "cp" : a == Axis::cp ? "ep" : to_string(a);
    order += (order.empty() ? "" : "-") + std::string(n);
  }
  ParallelSizes s;
  s.tp = ep_;
  s.pp = pp_;
  return ParallelLayout(world_size_, s, order);
}

int ParallelLayout::size(Axis axis) const {
  switch (axis) {
    case Axis::tp: return tp_;
    case Axis::cp: return cp_;
    case Axis::ep: return ep_;
    case Axis::dp: return dp_;
    case Axis::pp: return pp_;
  }
  return 1;
}

const std::vector<std::vector<int>>& ParallelLayout::groups(GroupKind kind) const {
  return groups_[kind_index(kind)];
}

int ParallelLayout::group_index(GroupKind kind, int rank) const {
  LF_CHECK(rank >= 0 && rank < world_size_, "rank ", rank, " is outside the layout's world of ",
           world_size_, " ranks");
  return index_of_rank_[kind_index(kind)][rank];
}

const std::vector<int>& ParallelLayout::group_of(GroupKind kind, int rank) const {
  static const std::vector<int> kNone;
  int i = group_index(kind, rank);
  return i < 0 ? kNone : groups_[kind_index(kind)][i];
}

RankCoords ParallelLayout::coords(int rank) const {
  auto pos = [&](GroupKind k) {
    const auto& grp = group_of(k, rank);
    return static_cast<int>(std::find(grp.begin(), grp.end(), rank) - grp.begin());
  };
  RankCoords c;
  c.tp = pos(GroupKind::tp);
  c.cp = pos(GroupKind::cp);
  c.dp = pos(GroupKind::dp);
  c.pp = pos(GroupKind::pp);
  c.ep = pos(GroupKind::ep);
  c.expert_dp = pos(GroupKind::expert_dp);
  return c;
}

std::string ParallelLayout::describe() const {
  std::ostringstream os;
  os << "parallel layout: world " << world_size_ << " = tp " << tp_ << " x cp " << cp_ << " x dp "
     << dp_ << " x pp " << pp_ << "; ep " << ep_ << " x expert-dp " << expert_dp_
     << (etp_ == tp_ ? " within dp x cp" : " within tp x dp x cp (expert tp 1)") << "; order " << order_string_ << " (fastest first)\n";
  for (GroupKind k : kAllGroupKinds) {
    const auto& list = groups(k);
    os << "  " << std::left << std::setw(10) << to_string(k) << " " << list.size()
       << (list.size() == 1 ? " group " : " groups") << ":";
    for (const auto& grp : list) os << " " << join(grp);
    os << "\n";
  }
  os << "  rank  tp  cp  dp  pp  ep  expert-dp\n";
  for (int r = 0; r < world_size_; ++r) {
    RankCoords c = coords(r);
    os << "  " << std::right << std::setw(4) << r << std::setw(4) << c.tp << std::setw(4) << c.cp
       << std::setw(4) << c.dp << std::setw(4) << c.pp << std::setw(4) << c.ep << std::setw(11)
       << c.expert_dp << "\n";
  }
  return os.str();
}

}  // namespace lf::dist
