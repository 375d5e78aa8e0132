// The VLM data-parallel load-balancing planner (dp_balance.h): the cost-model fit, the plan's
// invariants (every sample once, equal counts, the length cap, micro-batches, determinism), the
// all-to-all send plan, the ViT image variant, and the 1,000-iteration simulation on a VLM-like
// length mix whose numbers docs/data.md quotes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>

#include "loongforge/core/error.h"
#include "loongforge/data/dp_balance.h"

namespace {

using lf::data::BalanceOptions;
using lf::data::BalanceResult;
using lf::data::CostModel;
using lf::data::CostObservation;

// Portable draws (std distributions differ between standard libraries): the simulation's numbers
// must not depend on the toolchain.
double uniform01(std::mt19937_64& g) { return static_cast<double>(g() >> 11) * 0x1.0p-53; }
int64_t uniform_int(std::mt19937_64& g, int64_t lo, int64_t hi) {  // [lo, hi]
  return lo + static_cast<int64_t>(uniform01(g) * static_cast<double>(hi - lo + 1));
}

// A VLM-like sample: text of 100-500 tokens plus, with probability 7%, a video of 2K-16K tokens
// (uniform), 18% two to four images, otherwise one image; each image 64-1280 tokens (uniform).
int64_t draw_sample_length(std::mt19937_64& g) {
  const int64_t text = uniform_int(g, 100, 500);
  const double u = uniform01(g);
  if (u < 0.07) return text + uniform_int(g, 2048, 16384);
  if (u < 0.25) {
    int64_t s = text;
    for (int64_t k = uniform_int(g, 2, 4); k > 0; --k) s += uniform_int(g, 64, 1280);
    return s;
  }
  return text + uniform_int(g, 64, 1280);
}

std::vector<int64_t> draw_batch(std::mt19937_64& g, int64_t n) {
  std::vector<int64_t> l(static_cast<size_t>(n));
  for (auto& x : l) x = draw_sample_length(g);
  return l;
}

// The simulation's cost model, in token-equivalents of linear-layer work: b = 1 per token;
// a = 1/32768 per token^2 (for a 7B-class decoder, hidden 4096 x 32 layers, causal attention's
// FLOPs equal the linear layers' at ~53K tokens; attention kernels reach about 60% of the GEMMs'
// utilisation, so in time they break even near 32K); c = 64 per sample (per-sample overhead).
const CostModel kSimModel{1.0 / 32768, 1.0, 64.0};

// Checks a plan's invariants: every sample exactly once, counts, offsets, costs and lengths.
void expect_valid(const BalanceResult& r, const std::vector<int64_t>& lengths, int dp,
                  const CostModel& m, const BalanceOptions& o) {
  ASSERT_EQ(r.ranks.size(), static_cast<size_t>(dp));
  std::vector<int> seen(lengths.size(), 0);
  double max_cost = 0, total = 0;
  for (const auto& rp : r.ranks) {
    if (o.equal_counts) {
      EXPECT_EQ(rp.samples.size(), lengths.size() / static_cast<size_t>(dp));
    }
    ASSERT_EQ(rp.micro_batch_offsets.size(), static_cast<size_t>(o.micro_batches_per_rank + 1));
    EXPECT_EQ(rp.micro_batch_offsets.front(), 0);
    EXPECT_EQ(rp.micro_batch_offsets.back(), static_cast<int64_t>(rp.samples.size()));
    EXPECT_TRUE(std::is_sorted(rp.micro_batch_offsets.begin(), rp.micro_batch_offsets.end()));
    if (o.equal_counts) {
      for (size_t k = 1; k < rp.micro_batch_offsets.size(); ++k)
        EXPECT_EQ(rp.micro_batch_offsets[k] - rp.micro_batch_offsets[k - 1],
                  static_cast<int64_t>(rp.samples.size()) / o.micro_batches_per_rank);
    }
    double cost = 0;
    int64_t plen = 0;
    for (int64_t i : rp.samples) {
      ASSERT_GE(i, 0);
      ASSERT_LT(i, static_cast<int64_t>(lengths.size()));
      ++seen[static_cast<size_t>(i)];
      cost += m.sample_cost(lengths[static_cast<size_t>(i)]);
      plen += lengths[static_cast<size_t>(i)];
    }
    EXPECT_NEAR(rp.cost, cost, 1e-9 * std::max(1.0, cost));
    EXPECT_EQ(rp.packed_length, plen);
    if (!r.cap_exceeded && r.length_cap > 0) {
      EXPECT_LE(rp.packed_length, r.length_cap);
    }
    max_cost = std::max(max_cost, cost);
    total += cost;
  }
  for (size_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1) << "sample " << i;
  EXPECT_NEAR(r.stats.balanced_max_over_mean, total > 0 ? max_cost / (total / dp) : 1.0, 1e-9);
  EXPECT_GE(r.stats.balanced_max_over_mean, r.stats.lower_bound_max_over_mean - 1e-9);
  EXPECT_LE(r.stats.balanced_max_over_mean, r.stats.naive_max_over_mean + 1e-12);
}

// ---------------------------------------------------------------------------------------------
// The fit

std::vector<CostObservation> observe(const CostModel& truth, int count, double noise,
                                     uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<CostObservation> obs;
  for (int k = 0; k < count; ++k) {
    std::vector<int64_t> l = draw_batch(g, uniform_int(g, 4, 16));
    CostObservation o;
    for (int64_t x : l) {
      o.sum_sq_length += static_cast<double>(x) * static_cast<double>(x);
      o.sum_length += static_cast<double>(x);
    }
    o.n_samples = static_cast<double>(l.size());
    o.seconds = truth.cost(l) * (1 + noise * (2 * uniform01(g) - 1));
    obs.push_back(o);
  }
  return obs;
}

TEST(DpBalanceFit, RecoversKnownCoefficients) {
  // Seconds: 30 ps per token^2, 1 us per token, 200 us per sample.
  const CostModel truth{3e-11, 1e-6, 2e-4};
  CostModel exact = lf::data::fit_cost_model(observe(truth, 50, 0.0, 1));
  EXPECT_NEAR(exact.a / truth.a, 1, 1e-6);
  EXPECT_NEAR(exact.b / truth.b, 1, 1e-6);
  EXPECT_NEAR(exact.c / truth.c, 1, 1e-6);
  // +-3% uniform noise on each measured time, 400 warm-up observations (e.g. 50 iterations x 8
  // ranks).
  CostModel noisy = lf::data::fit_cost_model(observe(truth, 400, 0.03, 2));
  std::printf("fit with 3%% noise: a %.4g (true %.4g), b %.4g (%.4g), c %.4g (%.4g)\n", noisy.a,
              truth.a, noisy.b, truth.b, noisy.c, truth.c);
  EXPECT_NEAR(noisy.a / truth.a, 1, 0.05);
  EXPECT_NEAR(noisy.b / truth.b, 1, 0.03);
  EXPECT_NEAR(noisy.c / truth.c, 1, 0.25);
  // Whatever the coefficient errors, the fitted model predicts times within the noise.
  for (const auto& o : observe(truth, 100, 0.0, 3)) {
    double pred = noisy.a * o.sum_sq_length + noisy.b * o.sum_length + noisy.c * o.n_samples;
    EXPECT_NEAR(pred / o.seconds, 1, 0.02);
  }
}

TEST(DpBalanceFit, CoefficientsStayNonNegative) {
  // No per-sample cost and noise: the unconstrained c may come out negative; the fit clamps it
  // to exactly 0 and refits a, b on their own.
  const CostModel truth{3e-11, 1e-6, 0.0};
  for (uint64_t seed = 10; seed < 30; ++seed) {
    CostModel m = lf::data::fit_cost_model(observe(truth, 40, 0.05, seed));
    EXPECT_GE(m.a, 0);
    EXPECT_GE(m.b, 0);
    EXPECT_GE(m.c, 0);
    EXPECT_NEAR(m.b / truth.b, 1, 0.1);
  }
  // Times that fall with the sample count: the least-squares c is negative, the fit's is 0.
  std::vector<CostObservation> obs = observe(truth, 40, 0.0, 9);
  for (auto& o : obs) o.seconds -= 5e-5 * o.n_samples;
  CostModel m = lf::data::fit_cost_model(obs);
  EXPECT_EQ(m.c, 0.0);
  EXPECT_GE(m.a, 0);
  EXPECT_GT(m.b, 0);
}

TEST(DpBalanceFit, UnderDeterminedOrDegenerateObservationsAreErrors) {
  auto throws_with = [](const std::vector<CostObservation>& obs, const std::string& text) {
    try {
      lf::data::fit_cost_model(obs);
      ADD_FAILURE() << "no error; expected " << text;
    } catch (const lf::Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  const CostModel truth{3e-11, 1e-6, 2e-4};
  auto obs = observe(truth, 2, 0.0, 4);
  throws_with(obs, "at least 3");
  throws_with({}, "at least 3");
  // Same sample count and same total length everywhere: b and c cannot be told apart.
  std::vector<CostObservation> same;
  for (int k = 0; k < 10; ++k)
    same.push_back({1e6 + 1e4 * k, 8000, 8, 0.01 + 1e-4 * k});
  throws_with(same, "linearly dependent");
  // Identical observations.
  throws_with(std::vector<CostObservation>(5, {1e6, 1000, 4, 0.01}), "linearly dependent");
  // Bad values.
  obs = observe(truth, 5, 0.0, 5);
  obs[3].seconds = -1;
  throws_with(obs, "negative or non-finite");
  obs[3].seconds = std::nan("");
  throws_with(obs, "negative or non-finite");
  // A zero column.
  throws_with({{0, 0, 1, 1}, {0, 0, 2, 2}, {0, 0, 3, 3}}, "all zero");
  // Times all zero.
  obs = observe(truth, 5, 0.0, 6);
  for (auto& o : obs) o.seconds = 0;
  throws_with(obs, "no non-negative");
}

// ---------------------------------------------------------------------------------------------
// The plan

TEST(DpBalancePlan, NaivePlacementIsMegatronsContiguousSplit) {
  auto p = lf::data::naive_placement(10, 4);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0], (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(p[1], (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(p[2], (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(p[3], (std::vector<int64_t>{7, 8, 9}));
}

TEST(DpBalancePlan, HandExample) {
  // Two ranks, four samples, linear cost: naive {100, 90 | 10, 20} = 190 | 30; balanced puts
  // 100 with 10 or 20 and 90 with the other: 120 | 100 or 110 | 110.
  BalanceOptions o;
  o.tolerance = 0;
  auto r = lf::data::plan_balance({100, 90, 10, 20}, 2, CostModel{0, 1, 0}, o);
  EXPECT_FALSE(r.skipped);
  EXPECT_DOUBLE_EQ(r.stats.naive_max_over_mean, 190.0 / 110);
  EXPECT_DOUBLE_EQ(r.stats.balanced_max_over_mean, 1.0);
  // Relabelled for least movement: rank 0 keeps sample 0 (its longest), rank 1 keeps 3.
  EXPECT_EQ(r.ranks[0].samples, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(r.ranks[1].samples, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(r.stats.moved_samples, 2);
}

TEST(DpBalancePlan, EverySampleOnceCountsCapAndMicroBatches) {
  std::mt19937_64 g(7);
  int caps = 0, exceeded = 0;
  for (int dp : {1, 2, 3, 4, 8, 16}) {
    for (bool equal : {true, false}) {
      for (int micro : {1, 2}) {
        for (int it = 0; it < 40; ++it) {
          const int64_t per = 2 * uniform_int(g, 1, 12);
          int64_t n = equal ? per * dp : uniform_int(g, 0, 2 * per * dp);
          auto l = draw_batch(g, n);
          BalanceOptions o;
          o.equal_counts = equal;
          o.micro_batches_per_rank = micro;
          o.trigger_threshold = 0;
          o.max_length_ratio = it % 3 == 0 ? 1.1 : 1.5;
          auto r = lf::data::plan_balance(l, dp, kSimModel, o);
          SCOPED_TRACE(testing::Message() << "dp " << dp << " equal " << equal << " micro "
                                          << micro << " n " << n << " it " << it);
          expect_valid(r, l, dp, kSimModel, o);
          if (HasFatalFailure()) return;
          caps += r.length_cap > 0 && !r.skipped;
          exceeded += r.cap_exceeded && !r.skipped;
        }
      }
    }
  }
  std::printf("cap exceeded in %d of %d capped plans (ratios 1.1 and 1.5)\n", exceeded, caps);
  EXPECT_LE(exceeded, caps / 50);
}

TEST(DpBalancePlan, LengthCapIsRespected) {
  std::mt19937_64 g(8);
  const std::vector<double> ratios = {1.05, 1.1, 1.2, 1.5};
  std::vector<int> exceeded(ratios.size(), 0), plans(ratios.size(), 0);
  for (int it = 0; it < 300; ++it) {
    auto l = draw_batch(g, 64);
    for (size_t k = 0; k < ratios.size(); ++k) {
      BalanceOptions o;
      o.max_length_ratio = ratios[k];
      o.trigger_threshold = 0;
      auto r = lf::data::plan_balance(l, 8, kSimModel, o);
      // The cap's floor: the longest sample with the 7 shortest others (equal counts).
      std::vector<int64_t> sorted = l;
      std::sort(sorted.begin(), sorted.end());
      int64_t total = 0, floor_len = sorted.back();
      for (int64_t x : l) total += x;
      for (size_t j = 0; j < 7; ++j) floor_len += sorted[j];
      EXPECT_EQ(r.length_cap, std::max(floor_len, static_cast<int64_t>(std::floor(
                                                      ratios[k] * double(total) / 8))));
      if (r.skipped) continue;
      ++plans[k];
      bool over = false;
      for (const auto& rp : r.ranks) over |= rp.packed_length > r.length_cap;
      EXPECT_EQ(over, r.cap_exceeded);
      exceeded[k] += r.cap_exceeded;
    }
  }
  for (size_t k = 0; k < ratios.size(); ++k)
    std::printf("max_length_ratio %.2f: cap exceeded in %d of %d plans (DP 8, 8 samples a rank)\n",
                ratios[k], exceeded[k], plans[k]);
  // With equal counts a cap near the mean is often unsatisfiable on this mix: when several
  // long videos come together each one's rank also needs n/dp-1 companions, and the cap's floor
  // counts them for the longest only (e.g. videos of 14,588 and 14,619 tokens, cap 18,533: the
  // 14 shortest others are 3,739 + 5,815 tokens, so one rank is over whatever the plan). The
  // default 1.5 is always met here.
  EXPECT_EQ(exceeded.back(), 0);
  // No cap: never exceeded, length_cap 0.
  BalanceOptions o;
  o.max_length_ratio = 0;
  auto r = lf::data::plan_balance(draw_batch(g, 64), 8, kSimModel, o);
  EXPECT_EQ(r.length_cap, 0);
  EXPECT_FALSE(r.cap_exceeded);
}

TEST(DpBalancePlan, Deterministic) {
  std::mt19937_64 g(9);
  for (int it = 0; it < 50; ++it) {
    auto l = draw_batch(g, 64);
    if (it % 5 == 0) std::fill(l.begin() + 10, l.begin() + 40, 777);  // many ties
    auto a = lf::data::plan_balance(l, 8, kSimModel);
    auto b = lf::data::plan_balance(l, 8, kSimModel);
    for (size_t r = 0; r < 8; ++r) {
      EXPECT_EQ(a.ranks[r].samples, b.ranks[r].samples);
      EXPECT_EQ(a.ranks[r].micro_batch_offsets, b.ranks[r].micro_batch_offsets);
    }
    EXPECT_EQ(a.stats.balanced_max_over_mean, b.stats.balanced_max_over_mean);
  }
  // A fixed input gives a fixed plan (a change to tie-breaking shows here).
  // LPT: 5000 to rank 0, then 1200, 900 and the first two 300s fill rank 1 (4 samples), the
  // other 300s go to rank 0 (optimal: 5000 + 3 x 300 is the lower bound); rank 0 keeps sample 0.
  auto r = lf::data::plan_balance({5000, 300, 300, 900, 300, 1200, 300, 300}, 2, kSimModel,
                                  BalanceOptions{.tolerance = 0});
  EXPECT_EQ(r.ranks[0].samples, (std::vector<int64_t>{0, 4, 6, 7}));
  EXPECT_EQ(r.ranks[1].samples, (std::vector<int64_t>{1, 2, 3, 5}));
  EXPECT_DOUBLE_EQ(r.stats.balanced_max_over_mean, r.stats.lower_bound_max_over_mean);
}

TEST(DpBalancePlan, SkippedBelowTriggerAndWhenNoBetter) {
  std::vector<int64_t> l(32, 1000);
  auto r = lf::data::plan_balance(l, 4, kSimModel);
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.ranks[1].samples, lf::data::naive_placement(32, 4)[1]);
  EXPECT_DOUBLE_EQ(r.stats.naive_max_over_mean, 1.0);
  // 4% imbalance, below the default 5% trigger: rank 0 holds 1240 + 1080 + 6 x 1000, rank 1
  // 680 + 7 x 1000; loads 8320, 7680, 8000, 8000, mean 8000.
  l[0] = 1240;
  l[1] = 1080;
  l[8] = 680;
  const CostModel linear{0, 1, 0};
  r = lf::data::plan_balance(l, 4, linear);
  EXPECT_TRUE(r.skipped);
  EXPECT_DOUBLE_EQ(r.stats.naive_max_over_mean, 1.04);
  r = lf::data::plan_balance(l, 4, linear,
                             BalanceOptions{.tolerance = 0, .trigger_threshold = 0.01});
  EXPECT_FALSE(r.skipped);
  EXPECT_LE(r.stats.balanced_max_over_mean, 1.01 + 1e-12);
  // One sample carries nearly everything: nothing beats the naive split.
  r = lf::data::plan_balance({100000, 1, 1, 1}, 2, CostModel{0, 1, 0});
  EXPECT_TRUE(r.skipped);
}

TEST(DpBalancePlan, BadInputsAreErrors) {
  EXPECT_THROW(lf::data::plan_balance({1, 2, 3}, 2, kSimModel), lf::Error);  // 3 % 2 != 0
  EXPECT_THROW(lf::data::plan_balance({1, 2, 3, 4}, 2, kSimModel,
                                      BalanceOptions{.micro_batches_per_rank = 3}),
               lf::Error);
  EXPECT_THROW(lf::data::plan_balance({1, -2}, 2, kSimModel), lf::Error);
  EXPECT_THROW(lf::data::plan_balance({1, 2}, 0, kSimModel), lf::Error);
  EXPECT_THROW(lf::data::plan_balance({1, 2}, 2, CostModel{-1, 1, 0}), lf::Error);
  EXPECT_NO_THROW(lf::data::plan_balance({1, 2, 3}, 2, kSimModel,
                                         BalanceOptions{.equal_counts = false}));
  EXPECT_NO_THROW(lf::data::plan_balance({}, 2, kSimModel));
}

TEST(DpBalancePlan, SendPlanMovesExactlyTheReassignedSamples) {
  std::mt19937_64 g(10);
  for (bool minimize : {true, false}) {
    int64_t moved_total = 0;
    for (int it = 0; it < 100; ++it) {
      auto l = draw_batch(g, 64);
      BalanceOptions o;
      o.minimize_movement = minimize;
      auto r = lf::data::plan_balance(l, 8, kSimModel, o);
      auto cur = lf::data::naive_placement(64, 8);
      auto sp = lf::data::make_send_plan(cur, r);
      ASSERT_EQ(sp.send.size(), 8u);
      EXPECT_EQ(sp.moved_samples, r.stats.moved_samples);
      moved_total += sp.moved_samples;
      for (size_t dst = 0; dst < 8; ++dst) {
        // What dst receives, taken in its plan's order, is its plan.
        std::vector<int64_t> got;
        for (int64_t i : r.ranks[dst].samples)
          for (size_t src = 0; src < 8; ++src) {
            const auto& s = sp.send[src][dst];
            if (std::find(s.begin(), s.end(), i) != s.end()) {
              got.push_back(i);
              EXPECT_NE(std::find(cur[src].begin(), cur[src].end(), i), cur[src].end());
            }
          }
        EXPECT_EQ(got, r.ranks[dst].samples);
      }
      int64_t sent = 0;
      for (const auto& row : sp.send)
        for (const auto& s : row) sent += static_cast<int64_t>(s.size());
      EXPECT_EQ(sent, 64);
    }
    std::printf("samples moved per iteration (DP 8, 64 samples), minimize_movement=%d: %.2f\n",
                int(minimize), double(moved_total) / 100);
  }
}

// ---------------------------------------------------------------------------------------------
// ViT images

TEST(DpBalanceImages, PlanRoutesEveryImageAndBack) {
  std::mt19937_64 g(11);
  double naive = 0, bal = 0, bound = 0;
  const int iters = 200;
  for (int it = 0; it < iters; ++it) {
    const int dp = 8;
    std::vector<std::vector<int64_t>> imgs(dp);
    for (auto& r : imgs) {
      // 2-16 images a rank (a rank's samples hold 1-4 images each), 64-1280 tokens each.
      for (int64_t k = uniform_int(g, 2, 16); k > 0; --k) r.push_back(uniform_int(g, 64, 1280));
    }
    auto p = lf::data::plan_image_balance(imgs, dp);
    ASSERT_EQ(p.encode.size(), 8u);
    std::set<std::pair<int, int64_t>> seen;
    double max_cost = 0, total = 0;
    for (int e = 0; e < dp; ++e) {
      double cost = 0;
      for (size_t j = 0; j < p.encode[e].size(); ++j) {
        const auto& im = p.encode[e][j];
        EXPECT_TRUE(seen.insert({im.home, im.local}).second);
        const double len = double(imgs[static_cast<size_t>(im.home)][static_cast<size_t>(im.local)]);
        cost += len * len;
        // back is the inverse permutation.
        const auto& slot = p.back[static_cast<size_t>(im.home)][static_cast<size_t>(im.local)];
        EXPECT_EQ(slot.encoder, e);
        EXPECT_EQ(slot.position, static_cast<int64_t>(j));
      }
      max_cost = std::max(max_cost, cost);
      total += cost;
    }
    size_t n_img = 0;
    for (const auto& r : imgs) n_img += r.size();
    EXPECT_EQ(seen.size(), n_img);
    // send[src][dst]: src's local indices, in encode[dst] order.
    for (int dst = 0; dst < dp; ++dst) {
      std::vector<lf::data::ImageRef> from_send;
      for (int src = 0; src < dp; ++src)
        for (int64_t k : p.send[static_cast<size_t>(src)][static_cast<size_t>(dst)])
          from_send.push_back({src, k});
      EXPECT_EQ(from_send, p.encode[static_cast<size_t>(dst)]);
    }
    EXPECT_NEAR(p.stats.balanced_max_over_mean, max_cost / (total / dp), 1e-9);
    naive += p.stats.naive_max_over_mean;
    bal += p.stats.balanced_max_over_mean;
    bound += p.stats.lower_bound_max_over_mean;
  }
  std::printf("ViT images (cost len^2, DP 8, 2-16 images of 64-1280 tokens a rank, %d "
              "iterations): max/mean naive %.3f, balanced %.3f, lower bound %.3f\n",
              iters, naive / iters, bal / iters, bound / iters);
  EXPECT_LE(bal / iters, 1.05);
  EXPECT_GE(naive / iters, 1.4);
}

TEST(DpBalanceImages, NoImagesAndSkipped) {
  auto p = lf::data::plan_image_balance({{}, {}}, 2);
  EXPECT_TRUE(p.skipped);
  p = lf::data::plan_image_balance({{100, 100}, {100, 100}}, 2);
  EXPECT_TRUE(p.skipped);
  EXPECT_EQ(p.encode[0], (std::vector<lf::data::ImageRef>{{0, 0}, {0, 1}}));
  EXPECT_EQ(p.back[1][1], (lf::data::ImageSlot{1, 1}));
  // All images on rank 0: spread over both.
  p = lf::data::plan_image_balance({{500, 400, 300, 200}, {}}, 2);
  EXPECT_FALSE(p.skipped);
  EXPECT_EQ(p.encode[0].size() + p.encode[1].size(), 4u);
  EXPECT_LT(p.stats.balanced_max_over_mean, 1.3);
}

// ---------------------------------------------------------------------------------------------
// The simulation

struct SimResult {
  double naive_mean = 0, balanced_mean = 0, bound_mean = 0;
  double naive_worst = 0, balanced_worst = 0;
  int over_tolerance = 0, bound_over_tolerance = 0;
  double balanced_mean_feasible = 0;  // over the iterations whose lower bound is <= 1.05
  int feasible = 0;
};

SimResult simulate(int dp, int64_t global_batch, uint64_t seed) {
  std::mt19937_64 g(seed);
  SimResult s;
  const int iters = 1000;
  BalanceOptions o;
  o.trigger_threshold = 0;  // measure every iteration (the default 5% trigger changes nothing)
  for (int it = 0; it < iters; ++it) {
    auto l = draw_batch(g, global_batch);
    auto r = lf::data::plan_balance(l, dp, kSimModel, o);
    const auto& st = r.stats;
    s.naive_mean += st.naive_max_over_mean;
    s.balanced_mean += st.balanced_max_over_mean;
    s.bound_mean += st.lower_bound_max_over_mean;
    s.naive_worst = std::max(s.naive_worst, st.naive_max_over_mean);
    s.balanced_worst = std::max(s.balanced_worst, st.balanced_max_over_mean);
    s.over_tolerance += st.balanced_max_over_mean > 1.05;
    s.bound_over_tolerance += st.lower_bound_max_over_mean > 1.05;
    if (st.lower_bound_max_over_mean <= 1.05) {
      ++s.feasible;
      s.balanced_mean_feasible += st.balanced_max_over_mean;
    }
  }
  s.naive_mean /= iters;
  s.balanced_mean /= iters;
  s.bound_mean /= iters;
  if (s.feasible) s.balanced_mean_feasible /= s.feasible;
  std::printf("DP %d, global batch %3lld (%3lld a rank): max/mean naive %.3f (worst %.3f) | "
              "balanced %.3f (worst %.3f) | lower bound %.3f | iterations > 1.05: %d (bound > "
              "1.05: %d) | balanced where bound <= 1.05: %.3f (%d)\n",
              dp, static_cast<long long>(global_batch), static_cast<long long>(global_batch / dp),
              s.naive_mean, s.naive_worst, s.balanced_mean, s.balanced_worst, s.bound_mean,
              s.over_tolerance, s.bound_over_tolerance, s.balanced_mean_feasible, s.feasible);
  return s;
}

// Enough samples a rank (16 or more) for the mix to be balanceable: balanced <= 1.05 on average
// over 1,000 iterations, naive >= 1.4 at DP 4 and 8.
TEST(DpBalanceSimulation, MeetsTheTargetWithSixteenOrMoreSamplesPerRank) {
  auto s = simulate(8, 128, 100);
  EXPECT_LE(s.balanced_mean, 1.05);
  EXPECT_GE(s.naive_mean, 1.4);
  s = simulate(4, 64, 101);
  EXPECT_LE(s.balanced_mean, 1.05);
  EXPECT_GE(s.naive_mean, 1.4);
  // Two ranks of 32 samples average out on their own: naive ~1.16, not 1.4.
  s = simulate(2, 64, 102);
  EXPECT_LE(s.balanced_mean, 1.05);
  EXPECT_GE(s.naive_mean, 1.1);
}

// Eight samples a rank (DP 8 x global batch 64, DP 4 x 32, DP 2 x 16): a 16K-token video costs
// more than a whole rank's mean, so no placement of whole samples reaches 1.05 in most
// iterations. The planner stays within 0.015 of the lower bound on average, and within the
// tolerance on the iterations where the bound allows it.
TEST(DpBalanceSimulation, EightSamplesPerRankReachTheLowerBound) {
  for (auto [dp, gbs, seed] : {std::tuple{8, 64, 200}, std::tuple{4, 32, 201},
                               std::tuple{2, 16, 202}}) {
    auto s = simulate(dp, gbs, static_cast<uint64_t>(seed));
    EXPECT_LE(s.balanced_mean, s.bound_mean + 0.015) << "DP " << dp;
    EXPECT_LE(s.balanced_mean_feasible, 1.05) << "DP " << dp;
    EXPECT_LT(s.balanced_mean, s.naive_mean) << "DP " << dp;
    if (dp == 8) {
      EXPECT_GE(s.naive_mean, 1.4);
    }
  }
}

}  // namespace
