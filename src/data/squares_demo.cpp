#include "loongforge/data/squares_demo.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <cmath>

#include "loongforge/core/error.h"

namespace lf::data {
namespace {
struct Rgb {
  float r, g, b;
};
const std::vector<Rgb>& palette() {
  static const std::vector<Rgb> p = {{1, -1, -1}, {-1, 1, -1}, {-1, -1, 1}, {1, 1, -1}};
  return p;
}
}  // namespace

const std::vector<std::string>& squares_colours() {
  static const std::vector<std::string> c = {"red", "green", "blue", "yellow"};
  return c;
}
const std::vector<std::string>& squares_directions() {
  static const std::vector<std::string> d = {"left", "right", "up", "down"};
  return d;
}

std::string squares_caption(const std::string& colour, const std::string& direction) {
  return "a " + colour + " square moving " + direction;
}

TextTable squares_text_table(int64_t dim, uint64_t seed) {
  std::vector<std::string> words = {"a", "square", "moving"};
  for (const auto& c : squares_colours()) words.push_back(c);
  for (const auto& d : squares_directions()) words.push_back(d);
  return TextTable::random(words, dim, 8, seed);
}

LatentSample squares_clip(int64_t index, uint64_t seed, const SquaresOptions& o, const TextTable& table) {
  const int64_t travel = o.speed * (o.frames - 1);
  LF_CHECK(o.square + travel <= o.size, "squares demo: a ", o.square, "-pixel square moving ", o.speed,
           " pixels per frame for ", o.frames, " frames leaves a ", o.size, "-pixel frame");
  const int64_t c = index % 4, d = (index / 4) % 4;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ull + static_cast<uint64_t>(index) + 17);
  // An even offset in [0, hi].
  auto draw = [&](int64_t hi) { return hi <= 1 ? int64_t{0} : 2 * at::randint(0, hi / 2 + 1, {1}, gen).item<int64_t>(); };
  // Start so that the whole motion stays inside: along the motion, [0, size - square - travel];
  // across it, within 2 pixels of the middle.
  const int64_t mid = (o.size - o.square) / 2 / 2 * 2, lo = std::max<int64_t>(0, mid - 2);
  int64_t x = lo + draw(std::min<int64_t>(4, o.size - o.square - lo)), y = lo + draw(std::min<int64_t>(4, o.size - o.square - lo));
  int64_t dx = 0, dy = 0;
  const std::string& dir = squares_directions()[static_cast<size_t>(d)];
  if (dir == "left" || dir == "right") x = draw(o.size - o.square - travel);
  else y = draw(o.size - o.square - travel);
  if (dir == "left") x += travel, dx = -o.speed;
  if (dir == "right") dx = o.speed;
  if (dir == "up") y += travel, dy = -o.speed;
  if (dir == "down") dy = o.speed;
  // Black, with a dim one-pixel border: attention in a DiT sees only relative positions (RoPE),
  // and the border is what tells a token where in the frame it is.
  at::Tensor clip = at::full({3, o.frames, o.size, o.size}, -0.6f, at::kFloat);
  clip.narrow(2, 1, o.size - 2).narrow(3, 1, o.size - 2).fill_(-1.0f);
  const Rgb col = palette()[static_cast<size_t>(c)];
  for (int64_t f = 0; f < o.frames; ++f) {
    const int64_t fx = x + dx * f, fy = y + dy * f;
    for (int64_t ch = 0; ch < 3; ++ch)
      clip[ch][f].narrow(0, fy, o.square).narrow(1, fx, o.square).fill_(ch == 0 ? col.r : ch == 1 ? col.g : col.b);
  }
  LatentSample s;
  s.latents = clip;
  s.caption = squares_caption(squares_colours()[static_cast<size_t>(c)], dir);
  s.text = table.encode(s.caption);
  return s;
}

SquaresScore score_squares_clip(const at::Tensor& clip_in, const std::string& colour, const std::string& direction) {
  LF_CHECK(clip_in.dim() == 4 && clip_in.size(0) == 3, "squares demo: a clip is [3, frames, height, width], got ",
           clip_in.sizes());
  const at::Tensor clip = clip_in.to(at::kFloat).clamp(-1, 1);
  const int64_t frames = clip.size(1), h = clip.size(2), w = clip.size(3);
  // Lit pixels: some channel clearly above the black background.
  const at::Tensor lit = std::get<0>(clip.max(0)).gt(0.0);  // [F, H, W]
  SquaresScore s;
  if (lit.sum().item<int64_t>() == 0) return s;
  // Colour: the mean RGB of the lit pixels, nearest palette entry.
  const at::Tensor mean = (clip * lit.unsqueeze(0)).sum({1, 2, 3}) / lit.sum().to(at::kFloat);
  double best = 1e30;
  for (size_t k = 0; k < palette().size(); ++k) {
    const Rgb p = palette()[k];
    const double e = std::pow(mean[0].item<double>() - p.r, 2) + std::pow(mean[1].item<double>() - p.g, 2) +
                     std::pow(mean[2].item<double>() - p.b, 2);
    if (e < best) best = e, s.colour = squares_colours()[k];
  }
  // Direction: the centroid of the first and the last frame with lit pixels.
  auto centroid = [&](int64_t f) -> std::pair<double, double> {
    const at::Tensor m = lit[f].to(at::kFloat);
    const double n = m.sum().item<double>();
    if (n == 0) return {-1, -1};
    const at::Tensor ys = at::arange(h, at::kFloat).view({h, 1}), xs = at::arange(w, at::kFloat).view({1, w});
    return {(m * xs).sum().item<double>() / n, (m * ys).sum().item<double>() / n};
  };
  int64_t first = 0, last = frames - 1;
  while (first < frames && centroid(first).first < 0) ++first;
  while (last > first && centroid(last).first < 0) --last;
  if (last > first) {
    const auto [x0, y0] = centroid(first);
    const auto [x1, y1] = centroid(last);
    const double mx = x1 - x0, my = y1 - y0;
    if (std::abs(mx) >= std::abs(my)) s.direction = mx < 0 ? "left" : "right";
    else s.direction = my < 0 ? "up" : "down";
  }
  s.colour_ok = s.colour == colour;
  s.direction_ok = s.direction == direction;
  return s;
}

}  // namespace lf::data
