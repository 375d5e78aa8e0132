#include "loongforge/vla/reach_env.h"

#include <ATen/Functions.h>

#include <algorithm>
#include <cmath>
#include <regex>

#include "loongforge/core/error.h"

namespace lf::vla {
namespace {

// splitmix64: a small deterministic stream (the same scenes on every platform).
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform(double lo, double hi) { return lo + (hi - lo) * static_cast<double>(next() >> 11) * 0x1.0p-53; }
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
};

template <class T>
void shuffle(std::vector<T>& v, Rng& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[static_cast<size_t>(rng.below(static_cast<int64_t>(i)))]);
}

// Axis-aligned squares of sides a and b centred at p and q overlap (with `gap` to spare)?
bool overlap(double px, double py, double a, double qx, double qy, double b, double gap) {
  const double d = (a + b) / 2 + gap;
  return std::abs(px - qx) < d && std::abs(py - qy) < d;
}

at::Tensor floats(const std::vector<float>& v, std::vector<int64_t> shape) {
  return at::tensor(v, at::kFloat).reshape(shape);
}
at::Tensor ints(const std::vector<int64_t>& v) { return at::tensor(v, at::kLong); }

}  // namespace

const std::vector<std::string>& reach_colours() {
  static const std::vector<std::string> c = {"red", "green", "blue", "yellow"};
  return c;
}

std::array<uint8_t, 3> reach_colour_rgb(int64_t colour) {
  static const std::array<uint8_t, 3> rgb[] = {{220, 40, 40}, {40, 200, 60}, {50, 90, 230}, {230, 210, 40}};
  LF_CHECK(colour >= 0 && colour < 4, "reach task: no colour ", colour);
  return rgb[colour];
}

std::string reach_instruction(int64_t block_colour, int64_t target_colour) {
  return "put the " + reach_colours().at(static_cast<size_t>(block_colour)) + " block on the " +
         reach_colours().at(static_cast<size_t>(target_colour)) + " target";
}

std::pair<int64_t, int64_t> parse_reach_instruction(const std::string& text) {
  static const std::regex re(R"(^\s*put the (\w+) block on the (\w+) target\s*\.?\s*$)", std::regex::icase);
  std::smatch m;
  LF_CHECK(std::regex_match(text, m, re), "reach task: cannot read the instruction \"", text, "\"",
           lf::hint("instructions read \"put the <colour> block on the <colour> target\""));
  auto colour = [&](std::string name) {
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    const auto& cs = reach_colours();
    const auto it = std::find(cs.begin(), cs.end(), name);
    LF_CHECK(it != cs.end(), "reach task: the instruction \"", text, "\" names the colour '", name,
             "'; the colours are red, green, blue, yellow");
    return static_cast<int64_t>(it - cs.begin());
  };
  return {colour(m[1].str()), colour(m[2].str())};
}

ReachEnv::ReachEnv(ReachOptions options) : options_(options) {
  LF_CHECK(options_.image_size >= 16 && options_.image_size <= 1024, "reach task: image size ", options_.image_size,
           " is outside [16, 1024]");
  LF_CHECK(options_.max_steps >= 1, "reach task: max_steps must be positive, got ", options_.max_steps);
  LF_CHECK(options_.max_speed > 0 && options_.max_speed <= 1, "reach task: max_speed must be in (0, 1], got ",
           options_.max_speed);
  reset(0);
}

Observation ReachEnv::reset(uint64_t seed, bool swap_instruction) {
  Rng rng{seed * 0x2545F4914F6CDD1Dull + 0x5EEDull};
  const int64_t n_colours = static_cast<int64_t>(reach_colours().size());
  const int64_t bc = rng.below(n_colours);
  const int64_t tc = (bc + 1 + rng.below(n_colours - 1)) % n_colours;
  const int64_t n_blocks = 2 + rng.below(3), n_targets = 2 + rng.below(2);
  // Colours: the task's two in both lists (so the swapped task exists), the rest distinct others.
  std::vector<int64_t> others;
  for (int64_t c = 0; c < n_colours; ++c)
    if (c != bc && c != tc) others.push_back(c);
  shuffle(others, rng);
  std::vector<int64_t> block_colours = {bc, tc}, target_colours = {tc, bc};
  for (int64_t i = 2; i < n_blocks; ++i) block_colours.push_back(others[static_cast<size_t>(i - 2)]);
  shuffle(others, rng);
  for (int64_t i = 2; i < n_targets; ++i) target_colours.push_back(others[static_cast<size_t>(i - 2)]);
  shuffle(block_colours, rng);
  shuffle(target_colours, rng);

  const double bs = options_.block_size, ts = options_.target_size, margin = 0.02;
  for (;;) {  // rejection sampling; a few draws at most in practice
    targets_.clear();
    blocks_.clear();
    bool ok = true;
    for (int64_t c : target_colours) {
      ReachTarget t{0, 0, c};
      int tries = 0;
      do {
        t.x = rng.uniform(ts / 2 + margin, 1 - ts / 2 - margin);
        t.y = rng.uniform(ts / 2 + margin, 1 - ts / 2 - margin);
      } while (++tries < 200 && std::any_of(targets_.begin(), targets_.end(), [&](const ReachTarget& o) {
                 return overlap(t.x, t.y, ts, o.x, o.y, ts, margin);
               }));
      ok = ok && tries < 200;
      targets_.push_back(t);
    }
    for (int64_t c : block_colours) {
      ReachBlock b{0, 0, c};
      int tries = 0;
      auto bad = [&] {
        for (const auto& t : targets_)
          if (overlap(b.x, b.y, bs, t.x, t.y, ts, margin)) return true;
        for (const auto& o : blocks_)
          if (overlap(b.x, b.y, bs, o.x, o.y, bs, 2 * margin)) return true;
        return false;
      };
      do {
        b.x = rng.uniform(bs / 2 + margin, 1 - bs / 2 - margin);
        b.y = rng.uniform(bs / 2 + margin, 1 - bs / 2 - margin);
      } while (++tries < 200 && bad());
      ok = ok && tries < 200;
      blocks_.push_back(b);
    }
    if (ok) break;
  }
  gx_ = rng.uniform(0.05, 0.95);
  gy_ = rng.uniform(0.05, 0.95);
  closed_ = false;
  held_ = -1;
  steps_ = 0;
  original_task_ = {bc, tc};
  task_ = swap_instruction ? std::pair<int64_t, int64_t>{tc, bc} : original_task_;
  instruction_ = reach_instruction(task_.first, task_.second);
  return observe();
}

void ReachEnv::set_scene(std::vector<ReachBlock> blocks, std::vector<ReachTarget> targets, double gx, double gy,
                         std::pair<int64_t, int64_t> task) {
  blocks_ = std::move(blocks);
  targets_ = std::move(targets);
  gx_ = gx, gy_ = gy;
  closed_ = false;
  held_ = -1;
  steps_ = 0;
  task_ = original_task_ = task;
  instruction_ = reach_instruction(task.first, task.second);
}

ReachStep ReachEnv::step(const at::Tensor& action) {
  LF_CHECK(action.numel() == 3, "reach task: an action is (dx, dy, grip), 3 numbers; got shape ", action.sizes());
  const at::Tensor a = action.to(at::kCPU, at::kDouble).contiguous().view({3});
  const double* p = a.data_ptr<double>();
  return step(p[0], p[1], p[2]);
}

ReachStep ReachEnv::step(double dx, double dy, double grip) {
  LF_CHECK(std::isfinite(dx) && std::isfinite(dy) && std::isfinite(grip), "reach task: a non-finite action (", dx,
           ", ", dy, ", ", grip, ")");
  const double v = options_.max_speed;
  gx_ = std::clamp(gx_ + std::clamp(dx, -v, v), 0.0, 1.0);
  gy_ = std::clamp(gy_ + std::clamp(dy, -v, v), 0.0, 1.0);
  const bool want_closed = grip > 0;
  if (want_closed && !closed_) {
    closed_ = true;
    double best = options_.grasp_radius;
    for (size_t i = 0; i < blocks_.size(); ++i) {
      const double d = std::hypot(blocks_[i].x - gx_, blocks_[i].y - gy_);
      if (d <= best) best = d, held_ = static_cast<int64_t>(i);
    }
  } else if (!want_closed && closed_) {
    closed_ = false;
    held_ = -1;
  }
  if (held_ >= 0) {
    blocks_[static_cast<size_t>(held_)].x = gx_;
    blocks_[static_cast<size_t>(held_)].y = gy_;
  }
  ++steps_;
  ReachStep s;
  s.observation = observe();
  s.success = success();
  s.done = done();
  return s;
}

bool ReachEnv::task_done(int64_t block_colour, int64_t target_colour) const {
  if (closed_) return false;
  const double slack = (options_.target_size - options_.block_size) / 2 + 1e-9;
  for (const auto& b : blocks_) {
    if (b.colour != block_colour) continue;
    for (const auto& t : targets_)
      if (t.colour == target_colour && std::abs(b.x - t.x) <= slack && std::abs(b.y - t.y) <= slack) return true;
  }
  return false;
}

media::Image ReachEnv::render() const {
  const int64_t S = options_.image_size;
  media::Image img;
  img.height = img.width = S;
  img.rgb.assign(static_cast<size_t>(S * S * 3), 0);
  auto put = [&](int64_t x, int64_t y, std::array<uint8_t, 3> c) {
    if (x < 0 || y < 0 || x >= S || y >= S) return;
    std::copy(c.begin(), c.end(), img.rgb.begin() + (y * S + x) * 3);
  };
  for (int64_t y = 0; y < S; ++y)
    for (int64_t x = 0; x < S; ++x) put(x, y, {60, 60, 60});
  // A square of side `side` (table units) centred at (cx, cy): pixels [lo, hi) on each axis.
  auto span = [&](double c, double side) {
    const int64_t lo = static_cast<int64_t>(std::lround((c - side / 2) * static_cast<double>(S)));
    const int64_t n = std::max<int64_t>(1, std::lround(side * static_cast<double>(S)));
    return std::pair<int64_t, int64_t>{lo, lo + n};
  };
  const int64_t thick = std::max<int64_t>(1, S / 64);
  for (const auto& t : targets_) {
    const auto [x0, x1] = span(t.x, options_.target_size);
    const auto [y0, y1] = span(t.y, options_.target_size);
    for (int64_t y = y0; y < y1; ++y)
      for (int64_t x = x0; x < x1; ++x)
        if (x < x0 + thick || x >= x1 - thick || y < y0 + thick || y >= y1 - thick) put(x, y, reach_colour_rgb(t.colour));
  }
  // The held block last, so that it is drawn over the ones it is carried across.
  std::vector<size_t> order;
  for (size_t i = 0; i < blocks_.size(); ++i)
    if (static_cast<int64_t>(i) != held_) order.push_back(i);
  if (held_ >= 0) order.push_back(static_cast<size_t>(held_));
  for (size_t i : order) {
    const auto& b = blocks_[i];
    const auto [x0, x1] = span(b.x, options_.block_size);
    const auto [y0, y1] = span(b.y, options_.block_size);
    for (int64_t y = y0; y < y1; ++y)
      for (int64_t x = x0; x < x1; ++x) put(x, y, reach_colour_rgb(b.colour));
  }
  // The gripper: a white cross (open) or ring (closed), arm S / 32 pixels.
  const int64_t cx = std::min<int64_t>(S - 1, static_cast<int64_t>(gx_ * static_cast<double>(S)));
  const int64_t cy = std::min<int64_t>(S - 1, static_cast<int64_t>(gy_ * static_cast<double>(S)));
  const int64_t arm = std::max<int64_t>(2, S / 32);
  const std::array<uint8_t, 3> white = {255, 255, 255};
  for (int64_t d = -arm; d <= arm; ++d)
    for (int64_t e = -arm; e <= arm; ++e) {
      const bool draw = closed_ ? (std::max(std::abs(d), std::abs(e)) == arm) : (d == 0 || e == 0);
      if (draw) put(cx + d, cy + e, white);
    }
  return img;
}

Observation ReachEnv::observe() const {
  Observation o;
  const media::Image img = render();
  o.arrays["observation/image"] =
      at::from_blob(const_cast<uint8_t*>(img.rgb.data()), {img.height, img.width, 3}, at::kByte).clone();
  o.arrays["observation/state"] = floats({static_cast<float>(gx_), static_cast<float>(gy_), closed_ ? 1.0f : 0.0f}, {3});
  std::vector<float> bp, tp;
  std::vector<int64_t> bcol, tcol;
  for (const auto& b : blocks_) bp.push_back(static_cast<float>(b.x)), bp.push_back(static_cast<float>(b.y)), bcol.push_back(b.colour);
  for (const auto& t : targets_) tp.push_back(static_cast<float>(t.x)), tp.push_back(static_cast<float>(t.y)), tcol.push_back(t.colour);
  o.arrays["env/blocks"] = floats(bp, {static_cast<int64_t>(blocks_.size()), 2});
  o.arrays["env/block_colours"] = ints(bcol);
  o.arrays["env/targets"] = floats(tp, {static_cast<int64_t>(targets_.size()), 2});
  o.arrays["env/target_colours"] = ints(tcol);
  o.arrays["env/held"] = at::scalar_tensor(held_, at::kLong);
  o.prompt = instruction_;
  return o;
}

}  // namespace lf::vla
