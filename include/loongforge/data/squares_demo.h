// The diffusion demo's data: clips of one coloured square moving across a black background with a
// dim one-pixel border (the DiT's attention sees relative positions only; the border places them),
// captioned "a <colour> square moving <direction>", in a tiny "latent space" that is the pixels
// themselves (RGB in [-1, 1], no VAE), with a word-table text encoder (data/text_table.h). And the
// scorer of generated clips: the square's colour (the mean colour of the lit pixels, nearest of
// the four) and its direction (the track of the lit pixels' centroid from the first to the last
// frame, its dominant axis and sign).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "loongforge/data/latent_store.h"
#include "loongforge/data/text_table.h"

namespace lf::data {

struct SquaresOptions {
  // speed: pixels per frame. Positions and speed even: the square covers whole 2 x 2 patches.
  int64_t frames = 4, size = 16, square = 4, speed = 4;
};

const std::vector<std::string>& squares_colours();     // red, green, blue, yellow
const std::vector<std::string>& squares_directions();  // left, right, up, down
// The demo's text table: every caption word, rows drawn from `seed`.
TextTable squares_text_table(int64_t dim, uint64_t seed);
std::string squares_caption(const std::string& colour, const std::string& direction);

// Clip `index` of the demo (colour and direction cycle through all 16 pairs; the start position
// is drawn from seed and index, even: along the motion so the square stays in the frame, across it
// within 2 pixels of the middle): pixels [3, F, H, W] in [-1, 1].
LatentSample squares_clip(int64_t index, uint64_t seed, const SquaresOptions& options, const TextTable& table);

struct SquaresScore {
  std::string colour, direction;  // what the clip shows ("" when no square is visible)
  bool colour_ok = false, direction_ok = false;
};
// clip: [3, F, H, W] in [-1, 1]; the expected colour and direction.
SquaresScore score_squares_clip(const at::Tensor& clip, const std::string& colour, const std::string& direction);

}  // namespace lf::data
