// ParallelLayout against groups written out by hand from rank = c0 + s0 * (c1 + s1 * ...), fastest
// axis first. Each expectation below was derived on paper, not by running the code.
#include <gtest/gtest.h>

#include "loongforge/core/error.h"
#include "loongforge/dist/parallel_layout.h"

namespace lf::dist {
namespace {

using Groups = std::vector<std::vector<int>>;

std::string error_of(int world, ParallelSizes s,
                     std::string order = ParallelLayout::kDefaultOrder) {
  try {
    ParallelLayout l(world, s, order);
  } catch (const lf::Error& e) {
    return e.what();
  }
  return "";
}

// world 8 = tp 2 x cp 2 x dp 2: rank = tp + 2 * cp + 4 * dp.
TEST(ParallelLayout, Tp2Cp2Dp2) {
  ParallelLayout l(8, {.tp = 2, .cp = 2});
  EXPECT_EQ(l.size(Axis::dp), 2);
  EXPECT_EQ(l.groups(GroupKind::world), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));
  EXPECT_EQ(l.groups(GroupKind::tp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(l.groups(GroupKind::cp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(l.groups(GroupKind::dp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(l.groups(GroupKind::pp), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(l.groups(GroupKind::tp_cp), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(l.groups(GroupKind::dp_cp), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(l.groups(GroupKind::tp_dp_cp), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));
  EXPECT_EQ(l.groups(GroupKind::mp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(l.groups(GroupKind::embedding), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  // ep = 1: expert-dp spans dp x cp.
  EXPECT_EQ(l.groups(GroupKind::ep), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(l.groups(GroupKind::expert_dp), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  RankCoords c = l.coords(5);  // 5 = 1 + 2*0 + 4*1
  EXPECT_EQ(c.tp, 1);
  EXPECT_EQ(c.cp, 0);
  EXPECT_EQ(c.dp, 1);
  EXPECT_EQ(c.pp, 0);
  EXPECT_EQ(c.expert_dp, 2);  // position of 5 in [1, 3, 5, 7]
  EXPECT_EQ(l.group_of(GroupKind::cp, 6), (std::vector<int>{4, 6}));
  EXPECT_EQ(l.group_index(GroupKind::dp, 6), 2);
}

// Expert view of tp 2 x cp 2 x dp 2 with ep 2: rank = tp + 2 * ep + 4 * expert_dp.
TEST(ParallelLayout, ExpertGroupsWithinDpCp) {
  ParallelLayout l(8, {.tp = 2, .cp = 2, .ep = 2});
  EXPECT_EQ(l.expert_dp_size(), 2);
  EXPECT_EQ(l.groups(GroupKind::ep), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(l.groups(GroupKind::expert_dp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(l.groups(GroupKind::tp_ep), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  RankCoords c = l.coords(6);  // 6 = 0 + 2*1 + 4*1
  EXPECT_EQ(c.ep, 1);
  EXPECT_EQ(c.expert_dp, 1);
}

// Expert TP 1 (Megatron's --expert-tensor-parallel-size 1) on tp 2 x dp 2 x pp 2 with ep 2: the
// expert view numbers a stage's ranks as ep + 2 * expert_dp (+ 4 * pp), so the ep groups are the
// tp groups here and expert-dp the dp groups; with ep 4 one ep group spans the stage.
TEST(ParallelLayout, ExpertTp1SpansTheStage) {
  ParallelLayout l(8, {.tp = 2, .ep = 2, .pp = 2, .etp = 1});
  EXPECT_EQ(l.expert_tp_size(), 1);
  EXPECT_EQ(l.expert_dp_size(), 2);
  EXPECT_EQ(l.groups(GroupKind::ep), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(l.groups(GroupKind::expert_dp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  const ParallelLayout e = l.expert_layout();
  EXPECT_EQ(e.size(Axis::tp), 2);
  EXPECT_EQ(e.size(Axis::dp), 2);
  EXPECT_EQ(e.size(Axis::pp), 2);
  EXPECT_EQ(e.groups(GroupKind::tp), l.groups(GroupKind::ep));
  EXPECT_EQ(e.groups(GroupKind::dp), l.groups(GroupKind::expert_dp));
  EXPECT_EQ(e.groups(GroupKind::pp), l.groups(GroupKind::pp));

  ParallelLayout wide(8, {.tp = 2, .ep = 4, .pp = 2, .etp = 1});
  EXPECT_EQ(wide.groups(GroupKind::ep), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(wide.expert_dp_size(), 1);
  EXPECT_EQ(wide.expert_layout().groups(GroupKind::tp), wide.groups(GroupKind::ep));

  // dp 4 with ep 2, the default order: ep inside dp, as with expert TP = TP.
  ParallelLayout dp4(4, {.ep = 2, .etp = 1});
  EXPECT_EQ(dp4.expert_layout().groups(GroupKind::tp), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(dp4.expert_layout().groups(GroupKind::dp), (Groups{{0, 2}, {1, 3}}));
  // A user order with dp before ep: the expert layout follows it.
  ParallelLayout dp_first(4, {.ep = 2, .etp = 1}, "tp-cp-dp-ep-pp");
  EXPECT_EQ(dp_first.groups(GroupKind::ep), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(dp_first.expert_layout().groups(GroupKind::tp), dp_first.groups(GroupKind::ep));

  EXPECT_NE(error_of(8, {.tp = 4, .etp = 2}).find("must be 1 or tp=4"), std::string::npos);
  EXPECT_NE(error_of(4, {.tp = 2, .ep = 3, .etp = 1}).find("does not divide tp * dp * cp"), std::string::npos);
  EXPECT_NE(error_of(4, {.tp = 2, .ep = 4}).find("does not divide dp * cp"), std::string::npos);
  EXPECT_EQ(error_of(4, {.tp = 2, .ep = 4, .etp = 1}), "");
}

// Expert TP = TP 2 with ep 2 on tp 2 x dp 4: the experts' context numbers a tp x ep block as
// tp + 2 * ep (Sharding::outer's order), its dp is expert-dp; the ep groups join the ranks of the
// same TP rank. An order with dp between tp and ep cannot form the block and is refused.
TEST(ParallelLayout, ExpertTpEqualTpSplitsTheExpertsOverTpTimesEp) {
  ParallelLayout l(8, {.tp = 2, .ep = 2});
  EXPECT_EQ(l.expert_tp_size(), 2);
  EXPECT_EQ(l.expert_dp_size(), 2);
  EXPECT_EQ(l.groups(GroupKind::ep), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  const ParallelLayout e = l.expert_layout();
  EXPECT_EQ(e.size(Axis::tp), 4);
  EXPECT_EQ(e.groups(GroupKind::tp), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(e.groups(GroupKind::tp), l.groups(GroupKind::tp_ep));
  EXPECT_EQ(e.groups(GroupKind::dp), l.groups(GroupKind::expert_dp));
  EXPECT_EQ(e.groups(GroupKind::dp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  ParallelLayout staged(8, {.tp = 2, .ep = 2, .pp = 2});
  EXPECT_EQ(staged.expert_layout().groups(GroupKind::tp), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(staged.expert_layout().groups(GroupKind::pp), staged.groups(GroupKind::pp));
  try {
    ParallelLayout(8, {.tp = 2, .ep = 2}, "tp-cp-dp-ep-pp").expert_layout();
    ADD_FAILURE() << "dp between tp and ep cannot form the experts' tp x ep block";
  } catch (const lf::Error& err) {
    EXPECT_NE(std::string(err.what()).find("need tp then ep"), std::string::npos) << err.what();
  }
}

// world 8 = tp 2 x dp 2 x pp 2: rank = tp + 2 * dp + 4 * pp.
TEST(ParallelLayout, Tp2Pp2Dp2) {
  ParallelLayout l(8, {.tp = 2, .pp = 2});
  EXPECT_EQ(l.groups(GroupKind::tp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(l.groups(GroupKind::dp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(l.groups(GroupKind::pp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(l.groups(GroupKind::mp), (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(l.groups(GroupKind::embedding), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(l.groups(GroupKind::tp_cp), l.groups(GroupKind::tp));
  EXPECT_EQ(l.groups(GroupKind::dp_cp), l.groups(GroupKind::dp));
  EXPECT_EQ(l.groups(GroupKind::tp_dp_cp), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(l.coords(6).pp, 1);
  EXPECT_EQ(l.coords(6).dp, 1);
  EXPECT_EQ(l.coords(6).tp, 0);
}

// "tp-cp-pp-dp" (ep placed before dp): rank = tp + 2 * pp + 4 * dp.
TEST(ParallelLayout, OrderPpBeforeDp) {
  ParallelLayout l(8, {.tp = 2, .pp = 2}, "tp-cp-pp-dp");
  EXPECT_EQ(l.groups(GroupKind::pp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(l.groups(GroupKind::dp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(l.groups(GroupKind::mp), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(l.groups(GroupKind::embedding), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
}

// "pp-tp-cp-dp": pp fastest: rank = pp + 2 * tp + 4 * dp.
TEST(ParallelLayout, OrderPpFastest) {
  ParallelLayout l(8, {.tp = 2, .pp = 2}, "pp-tp-cp-ep-dp");
  EXPECT_EQ(l.groups(GroupKind::tp), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(l.groups(GroupKind::pp), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(l.groups(GroupKind::dp), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(l.coords(3).tp, 1);
  EXPECT_EQ(l.coords(3).pp, 1);
}

// pp 4 with tp 2 (world 8): rank = tp + 2 * pp; pipelines [0,2,4,6] and [1,3,5,7].
TEST(ParallelLayout, EmbeddingGroupsPp4) {
  ParallelLayout l(8, {.tp = 2, .pp = 4});
  EXPECT_EQ(l.groups(GroupKind::pp), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(l.groups(GroupKind::embedding), (Groups{{0, 6}, {1, 7}}));
  EXPECT_TRUE(l.group_of(GroupKind::embedding, 2).empty());
  EXPECT_EQ(l.group_index(GroupKind::embedding, 4), -1);
  EXPECT_EQ(l.group_of(GroupKind::embedding, 7), (std::vector<int>{1, 7}));
  // pp 4 alone over 4 ranks.
  ParallelLayout p(4, {.pp = 4});
  EXPECT_EQ(p.groups(GroupKind::embedding), (Groups{{0, 3}}));
}

TEST(ParallelLayout, SingleRank) {
  ParallelLayout l(1, {});
  for (GroupKind k : kAllGroupKinds) EXPECT_EQ(l.groups(k), (Groups{{0}})) << to_string(k);
}

TEST(ParallelLayout, ValidationNamesTheClash) {
  std::string e = error_of(8, {.tp = 3});
  EXPECT_NE(e.find("world size 8 is not divisible by tp * cp * pp = 3 * 1 * 1 = 3"),
            std::string::npos) << e;
  e = error_of(8, {.tp = 2, .cp = 2, .ep = 3});
  EXPECT_NE(e.find("ep=3 does not divide dp * cp = 2 * 2 = 4"), std::string::npos) << e;
  EXPECT_NE(e.find("world size 8"), std::string::npos) << e;
  e = error_of(8, {.tp = 0});
  EXPECT_NE(e.find("(tp) is 0"), std::string::npos) << e;
  e = error_of(8, {.tp = 2, .dp = 3});
  EXPECT_NE(e.find("dp=3 does not match world / (tp * cp * pp) = 8 / 2 = 4"), std::string::npos)
      << e;
  e = error_of(8, {.tp = 2}, "tp-cp-dp");
  EXPECT_NE(e.find("lacks axis 'pp'"), std::string::npos) << e;
  e = error_of(8, {.tp = 2}, "tp-cp-tp-dp-pp");
  EXPECT_NE(e.find("names axis 'tp' twice"), std::string::npos) << e;
  e = error_of(8, {.tp = 2}, "tp-cp-xp-dp-pp");
  EXPECT_NE(e.find("unknown axis 'xp'"), std::string::npos) << e;
  EXPECT_NE(e.find("HINT"), std::string::npos) << e;
  // cp before tp splits the expert view differently from the dense one.
  e = error_of(8, {.tp = 2, .cp = 2, .ep = 2}, "cp-tp-ep-dp-pp");
  EXPECT_NE(e.find("expert layout disagree"), std::string::npos) << e;
}

TEST(ParallelLayout, DescribeListsEveryGroup) {
  ParallelLayout l(8, {.tp = 2, .cp = 2});
  std::string d = l.describe();
  EXPECT_NE(d.find("world 8 = tp 2 x cp 2 x dp 2 x pp 1"), std::string::npos) << d;
  EXPECT_NE(d.find("dp-cp      2 groups: [0, 2, 4, 6] [1, 3, 5, 7]"), std::string::npos) << d;
  EXPECT_NE(d.find("cp         4 groups: [0, 2] [1, 3] [4, 6] [5, 7]"), std::string::npos) << d;
  EXPECT_NE(d.find("expert-dp"), std::string::npos) << d;
  // Rank 5: tp 1, cp 0, dp 1, pp 0, ep 0, expert-dp 2.
  EXPECT_NE(d.find("     5   1   0   1   0   0          2"), std::string::npos) << d;
}

}  // namespace
}  // namespace lf::dist
