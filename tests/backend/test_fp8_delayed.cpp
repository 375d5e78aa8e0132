// Delayed FP8 scaling (backend/fp8_delayed.h): the scale a GEMM uses is the table's, not its
// tensor's; each step records the amax of input, weight and output gradient in its own column;
// update() turns the history into scales (most_recent / max, margin, the format of each column),
// keeps the scale where nothing or a non-finite amax was recorded, and rolls the history; a step
// whose scales come from the previous step's identical tensors is the tensorwise step bit for bit
// (linear and grouped, with an empty group); evaluation records nothing; the checkpoint's entries.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>

#include "loongforge/backend/fp8.h"
#include "loongforge/backend/fp8_delayed.h"
#include "loongforge/core/error.h"

namespace {

using lf::ops::Fp8AmaxTable;
using lf::ops::Fp8DelayedScaling;
using lf::ops::Fp8Recipe;

Fp8Recipe delayed(int64_t len = 1, const std::string& algo = "most_recent", int margin = 0,
                  const std::string& format = "hybrid") {
  return Fp8Recipe::from_names(format, "delayed", margin, len, algo);
}

TEST(Fp8Delayed, QuantizeWithAGivenScaleSaturates) {
  // scale 0.5: 3 -> 1.5, 100 -> 50 -> 48 (E4M3 spacing 4 between 32 and 64, ties to even), 2000 ->
  // 1000, beyond 448: saturated.
  const auto q = lf::ops::quantize_scaled(at::tensor({3.0f, 100.0f, -2000.0f}).reshape({1, 3}), at::kFloat8_e4m3fn,
                                          at::full({1}, 0.5f));
  EXPECT_TRUE(at::equal(q.data.to(at::kFloat), at::tensor({1.5f, 48.0f, -448.0f}).reshape({1, 3})));
  EXPECT_FLOAT_EQ(q.scale_inv.item<float>(), 2.0f);
  EXPECT_TRUE(at::equal(q.dequantize(), at::tensor({3.0f, 96.0f, -896.0f}).reshape({1, 3})));
}

TEST(Fp8Delayed, RecipeNamesAndIdentity) {
  const Fp8Recipe r = delayed(16, "max", 1, "e4m3");
  EXPECT_EQ(r.scaling, lf::ops::Fp8Scaling::delayed);
  EXPECT_EQ(r.amax_history_len, 16);
  EXPECT_EQ(r.amax_compute_algo, lf::ops::Fp8AmaxAlgo::max);
  EXPECT_EQ(r.describe(), "delayed e4m3 (margin 1, amax history 16, max)");
  EXPECT_NE(r, delayed(8, "max", 1, "e4m3"));
  EXPECT_NE(r, delayed(16, "most_recent", 1, "e4m3"));
  Fp8Recipe with_state = r;
  Fp8DelayedScaling state(r);
  with_state.delayed = &state;
  EXPECT_EQ(with_state, r);  // the state is not the recipe
  // The history knobs are not part of the other recipes.
  Fp8Recipe t = Fp8Recipe::from_names("hybrid", "tensorwise", 0, 16, "max");
  EXPECT_EQ(t, Fp8Recipe{});
  EXPECT_THROW(Fp8Recipe::from_names("hybrid", "delayed", 0, 0), lf::Error);
  EXPECT_THROW(Fp8Recipe::from_names("hybrid", "delayed", 0, 4, "mean"), lf::Error);
  EXPECT_THROW(Fp8DelayedScaling(Fp8Recipe{}), lf::Error);
}

// One step of y = x w^T with output gradient dy under `r`: y, dx, dw.
struct Step {
  at::Tensor y, dx, dw;
};
Step run(const Fp8Recipe& r, const at::Tensor& x0, const at::Tensor& w0, const at::Tensor& dy) {
  auto x = x0.clone().requires_grad_(true), w = w0;
  w.mutable_grad() = at::Tensor();
  auto y = lf::ops::fp8_linear(x, w, {}, r, nullptr, nullptr);
  y.backward(dy);
  return {y.detach(), x.grad(), w.grad().clone()};
}

TEST(Fp8Delayed, HistoryRecordsEachOperandAndBecomesTheScales) {
  at::manual_seed(3);
  const Fp8Recipe r = delayed(3, "max", 1);
  Fp8DelayedScaling state(r);
  Fp8Recipe rr = r;
  rr.delayed = &state;
  auto w = (at::randn({16, 32}) * 0.05).requires_grad_(true);
  auto other = at::randn({8, 8});
  Fp8AmaxTable& t = state.add_group({{"w", w}, {"bias", at::zeros({16})}, {"other", other}}, {});
  ASSERT_EQ(t.entries().size(), 2u);  // 1-d tensors have no GEMM
  EXPECT_EQ(t.entries()[1].offset, 3);
  EXPECT_TRUE(t.used().empty());
  // Three steps with amaxes growing then shrinking; the history keeps 3, the max algorithm takes
  // their largest.
  const std::vector<float> xs{2.0f, 8.0f, 1.0f}, dys{1e-3f, 4e-3f, 5e-4f};
  for (size_t s = 0; s < xs.size(); ++s) {
    auto x = at::full({4, 32}, xs[s]);
    auto dy = at::full({4, 16}, dys[s]);
    run(rr, x, w, dy);
    const auto row = t.history()[0];
    EXPECT_FLOAT_EQ(row[0].item<float>(), xs[s]);
    EXPECT_FLOAT_EQ(row[1].item<float>(), w.detach().abs().max().item<float>());
    EXPECT_FLOAT_EQ(row[2].item<float>(), dys[s]);
    EXPECT_EQ(row.narrow(0, 3, 3).abs().sum().item<float>(), 0.0f);  // "other" was not used
    state.update();
    // margin 1: 2^-1 fp8_max / amax; inputs and weights E4M3 (448), hybrid's gradients E5M2 (57344).
    const float xmax = *std::max_element(xs.begin(), xs.begin() + static_cast<long>(s) + 1);
    const float gmax = *std::max_element(dys.begin(), dys.begin() + static_cast<long>(s) + 1);
    EXPECT_FLOAT_EQ(t.scale()[0].item<float>(), 224.0f / xmax) << s;
    EXPECT_FLOAT_EQ(t.scale()[2].item<float>(), 28672.0f / gmax) << s;
    EXPECT_FLOAT_EQ(t.scale()[3].item<float>(), 1.0f);  // nothing recorded: the scale stays
    EXPECT_EQ(t.history()[0].abs().sum().item<float>(), 0.0f);  // the new step's row starts at 0
    EXPECT_FLOAT_EQ(t.history()[2][0].item<float>(), xs[s]);    // the newest step last
  }
  ASSERT_EQ(t.used().size(), 1u);
  EXPECT_EQ(t.used()[0]->name, "w");
  // The window is the last 3 steps: the 8 of step 2 counts through step 4 and is gone at step 5.
  run(rr, at::full({4, 32}, 1.0f), w, at::full({4, 16}, 1e-3f));
  state.update();
  EXPECT_FLOAT_EQ(t.scale()[0].item<float>(), 224.0f / 8.0f);
  run(rr, at::full({4, 32}, 1.0f), w, at::full({4, 16}, 1e-3f));
  state.update();
  EXPECT_FLOAT_EQ(t.scale()[0].item<float>(), 224.0f);

  // most_recent: the last step alone; a non-finite amax keeps the scale.
  Fp8DelayedScaling recent(delayed(3, "most_recent"));
  Fp8Recipe rc = recent.recipe();
  rc.delayed = &recent;
  Fp8AmaxTable& tr = recent.add_group({{"w", w}}, {});
  for (float v : {8.0f, 2.0f}) {
    run(rc, at::full({4, 32}, v), w, at::full({4, 16}, 1e-3f));
    recent.update();
  }
  EXPECT_FLOAT_EQ(tr.scale()[0].item<float>(), 448.0f / 2.0f);
  auto bad = at::full({4, 32}, 1.0f);
  bad[0][0] = std::numeric_limits<float>::infinity();
  run(rc, bad, w, at::full({4, 16}, 1e-3f));
  recent.update();
  EXPECT_FLOAT_EQ(tr.scale()[0].item<float>(), 448.0f / 2.0f);
}

// When the history holds exactly this step's amaxes (the same tensors as the last step), the
// delayed scales equal the current ones: every GEMM result bit for bit the tensorwise one.
TEST(Fp8Delayed, ScalesFromTheSameTensorsGiveTheTensorwiseStep) {
  at::manual_seed(4);
  for (const std::string format : {"hybrid", "e4m3"})
    for (int margin : {0, 2}) {
      const Fp8Recipe r = delayed(2, "most_recent", margin, format);
      Fp8DelayedScaling state(r);
      Fp8Recipe rr = r;
      rr.delayed = &state;
      auto w = (at::randn({48, 64}) * 0.03).requires_grad_(true);
      state.add_group({{"w", w}}, {});
      const auto x = at::randn({40, 64}), dy = at::randn({40, 48}) * 1e-3;
      const Step first = run(rr, x, w, dy);
      state.update();
      const Step second = run(rr, x, w, dy);
      const Step current = run(Fp8Recipe::from_names(format, "tensorwise", margin), x, w, dy);
      EXPECT_TRUE(at::equal(second.y, current.y)) << format << " margin " << margin;
      EXPECT_TRUE(at::equal(second.dx, current.dx)) << format << " margin " << margin;
      EXPECT_TRUE(at::equal(second.dw, current.dw)) << format << " margin " << margin;
      // The first step (scales 1) is another computation: small gradients underflow at scale 1.
      EXPECT_FALSE(at::equal(first.dw, current.dw));
    }
}

TEST(Fp8Delayed, GroupedGemmHasAnEntryPerGroup) {
  at::manual_seed(5);
  const Fp8Recipe r = delayed(1);
  Fp8DelayedScaling state(r);
  Fp8Recipe rr = r;
  rr.delayed = &state;
  auto w = (at::randn({3, 24, 32}) * 0.04).requires_grad_(true);
  Fp8AmaxTable& t = state.add_group({{"experts.fc1", w}}, {});
  ASSERT_EQ(t.entries().size(), 1u);
  EXPECT_EQ(t.entries()[0].width, 9);
  const auto counts = at::tensor(std::vector<int64_t>{5, 0, 7});
  auto x0 = at::randn({12, 32});
  // Rows of group 2 ten times larger: its own input column.
  x0.narrow(0, 5, 7).mul_(10);
  const auto dy = at::randn({12, 24}) * 1e-3;
  auto step = [&](const Fp8Recipe& rec) {
    auto x = x0.clone().requires_grad_(true);
    w.mutable_grad() = at::Tensor();
    auto y = lf::ops::fp8_grouped_linear(x, w, counts, rec, nullptr);
    y.backward(dy);
    return Step{y.detach(), x.grad(), w.grad().clone()};
  };
  step(rr);
  const auto row = t.history()[0];
  EXPECT_FLOAT_EQ(row[0].item<float>(), x0.narrow(0, 0, 5).abs().max().item<float>());
  EXPECT_FLOAT_EQ(row[6].item<float>(), x0.narrow(0, 5, 7).abs().max().item<float>());
  EXPECT_FLOAT_EQ(row[7].item<float>(), w[2].detach().abs().max().item<float>());
  EXPECT_FLOAT_EQ(row[8].item<float>(), dy.narrow(0, 5, 7).abs().max().item<float>());
  EXPECT_EQ(row.narrow(0, 3, 3).abs().sum().item<float>(), 0.0f);  // the empty group
  state.update();
  const Step second = step(rr), current = step(Fp8Recipe{});
  EXPECT_TRUE(at::equal(second.y, current.y));
  EXPECT_TRUE(at::equal(second.dx, current.dx));
  EXPECT_TRUE(at::equal(second.dw, current.dw));
  EXPECT_FLOAT_EQ(t.scale()[3].item<float>(), 1.0f);
}

TEST(Fp8Delayed, EvaluationRecordsNothingAndUnknownWeightsAreRefused) {
  const Fp8Recipe r = delayed(1);
  Fp8DelayedScaling state(r);
  Fp8Recipe rr = r;
  rr.delayed = &state;
  auto w = at::randn({8, 16}).requires_grad_(true);
  Fp8AmaxTable& t = state.add_group({{"w", w}}, {});
  {
    at::NoGradGuard no_grad;
    lf::ops::fp8_linear(at::randn({4, 16}), w, {}, rr, nullptr, nullptr);
  }
  EXPECT_EQ(t.history().abs().sum().item<float>(), 0.0f);
  // In training a frozen weight and input (a frozen base layer) still record.
  lf::ops::fp8_linear(at::randn({4, 16}), w.detach(), {}, rr, nullptr, nullptr);
  EXPECT_GT(t.history()[0][1].item<float>(), 0.0f);
  try {
    lf::ops::fp8_linear(at::randn({4, 16}), at::randn({8, 16}), {}, rr, nullptr, nullptr);
    FAIL() << "an unknown weight was accepted";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a parameter the run keeps scales for"), std::string::npos) << e.what();
  }
  // A weight whose storage moved after the table was built (the optimizer's flat buffers) is still
  // found; a view of it at the same address with another shape is not the weight.
  const auto before = t.history()[0][0].item<float>();
  w.set_data(w.detach().clone());
  lf::ops::fp8_linear(at::full({4, 16}, 2.0f * before + 1.0f), w, {}, rr, nullptr, nullptr);
  EXPECT_FLOAT_EQ(t.history()[0][0].item<float>(), 2.0f * before + 1.0f);
  EXPECT_THROW(lf::ops::fp8_linear(at::randn({4, 16}), w.detach().narrow(0, 0, 4), {}, rr, nullptr, nullptr),
               lf::Error);
  Fp8Recipe no_state = r;
  EXPECT_THROW(lf::ops::fp8_linear(at::randn({4, 16}), w, {}, no_state, nullptr, nullptr), lf::Error);
}

TEST(Fp8Delayed, StateRoundTripsAndRefusesAnotherLength) {
  const Fp8Recipe r = delayed(4, "max");
  Fp8DelayedScaling a(r), b(r);
  auto w = at::randn({8, 16});
  Fp8AmaxTable& ta = a.add_group({{"w", w}}, {});
  Fp8AmaxTable& tb = b.add_group({{"w", w}}, {});
  Fp8Recipe ra = r;
  ra.delayed = &a;
  for (int s = 0; s < 3; ++s) {
    run(ra, at::randn({4, 16}) * (s + 1), w.requires_grad_(true), at::randn({4, 8}));
    a.update();
  }
  const auto& e = ta.entries()[0];
  auto [h, sc] = ta.state(e);
  EXPECT_EQ(h.sizes(), (std::vector<int64_t>{4, 3}));
  tb.set_state(tb.entries()[0], h, sc, "test");
  EXPECT_TRUE(at::equal(ta.history(), tb.history()));
  EXPECT_TRUE(at::equal(ta.scale(), tb.scale()));
  try {
    tb.set_state(tb.entries()[0], h.narrow(0, 0, 2), sc, "checkpoint /x/iter_0000005");
    FAIL() << "a history of another length was accepted";
  } catch (const lf::Error& err) {
    const std::string m = err.what();
    EXPECT_NE(m.find("checkpoint /x/iter_0000005"), std::string::npos) << m;
    EXPECT_NE(m.find("--fp8-amax-history-len 2"), std::string::npos) << m;
  }
}

// A resumed table names, once, the weights that recorded an amax in the first step but got no state
// from the checkpoint (new to FP8 since it was saved); one that was loaded, or did not run in FP8,
// is not named; without expect_state_from nothing is; an entry loaded with nothing in it is named.
TEST(Fp8Delayed, ResumedTableNamesWeightsNewToFp8) {
  const Fp8Recipe r = delayed(2, "max");
  Fp8DelayedScaling s(r);
  auto w0 = at::randn({8, 16}), w1 = at::randn({8, 16}), w2 = at::randn({8, 16});
  Fp8AmaxTable& t = s.add_group({{"loaded", w0}, {"new", w1}, {"idle", w2}}, {});
  Fp8Recipe rs = r;
  rs.delayed = &s;
  auto step = [&] {
    run(rs, at::randn({4, 16}), w0.requires_grad_(true), at::randn({4, 8}));
    run(rs, at::randn({4, 16}), w1.requires_grad_(true), at::randn({4, 8}));
  };
  step();
  EXPECT_TRUE(t.take_recorded_without_state().empty());  // not resumed
  s.update();
  t.set_state(t.entries()[0], at::ones({2, 3}), at::ones({3}), "test");
  t.expect_state_from("checkpoint /x/iter_0000005");
  step();
  EXPECT_EQ(t.take_recorded_without_state(), std::vector<std::string>{"new"});
  EXPECT_TRUE(t.take_recorded_without_state().empty());  // once
  s.update();
  step();
  EXPECT_TRUE(t.take_recorded_without_state().empty());
  // An entry stored unused (no amax, scale 1: a part of an expert weight's is stored whether used
  // or not) is no state: named too.
  s.update();
  t.set_state(t.entries()[1], at::zeros({2, 3}), at::ones({3}), "test");
  t.expect_state_from("checkpoint /x/iter_0000010");
  step();
  EXPECT_EQ(t.take_recorded_without_state(), std::vector<std::string>{"new"});
}

// Experts over expert-parallel ranks: rank r's grouped weight [G/ep, out, in] is part r of the whole
// weight's entry. set_state takes the whole weight's columns and keeps this part's (experts
// r G/ep .. (r+1) G/ep - 1: columns 3 r G/ep ..); a whole of another width is refused.
TEST(Fp8Delayed, ExpertPartsTakeTheirColumnsOfTheWhole) {
  const Fp8Recipe r = delayed(2, "max");
  Fp8DelayedScaling whole(r), second(r);
  const auto w = at::randn({4, 8, 16}), part = w.narrow(0, 2, 2).contiguous();
  Fp8AmaxTable& tw = whole.add_group({{"experts.fc1", w}}, {});
  Fp8AmaxTable& tp = second.add_group({{"experts.fc1", part, 2, 1}}, {});
  ASSERT_EQ(tp.entries()[0].width, 6);
  EXPECT_EQ(tp.entries()[0].parts, 2);
  EXPECT_EQ(tp.entries()[0].part, 1);
  at::Tensor h = at::arange(24, at::kFloat).reshape({2, 12}) + 1, sc = at::arange(12, at::kFloat) + 100;
  tw.set_state(tw.entries()[0], h, sc, "test");
  tp.set_state(tp.entries()[0], h, sc, "test");
  EXPECT_TRUE(at::equal(tp.history(), h.narrow(1, 6, 6)));
  EXPECT_TRUE(at::equal(tp.scale(), sc.narrow(0, 6, 6)));
  // The part's own state is its columns only (a checkpoint stores it as that part of the whole).
  auto [ph, ps] = tp.state(tp.entries()[0]);
  EXPECT_TRUE(at::equal(ph, h.narrow(1, 6, 6)));
  EXPECT_THROW(tp.set_state(tp.entries()[0], h.narrow(1, 0, 6), sc.narrow(0, 0, 6), "test"), lf::Error);
  EXPECT_THROW(second.add_group({{"bad", at::randn({8, 16}), 2, 0}}, {}), lf::Error);  // a 2-d weight in parts
}

}  // namespace
