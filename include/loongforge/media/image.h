// Images as VLM data pipelines read them: decoding PNG (libpng) and JPEG (libjpeg-turbo) files to
// 8-bit RGB, and Pillow's resampling, so that what we feed a vision tower equals what
// transformers' PIL image processors produce from the same file. Plain buffers, no LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lf::media {

// An 8-bit RGB image, row-major, channels last: rgb[(y * width + x) * 3 + c].
struct Image {
  int64_t height = 0;
  int64_t width = 0;
  std::vector<uint8_t> rgb;
};

// Decodes a PNG or JPEG file (told apart by its first bytes, not its name) to RGB as transformers'
// `convert_to_rgb` makes it: grey replicated, palettes expanded, 16-bit channels cut to their high
// byte, and transparency (an alpha channel or a tRNS chunk) composited onto white with Pillow's
// integer arithmetic. JPEG: libjpeg's defaults (integer IDCT, fancy upsampling), as Pillow
// decodes. Refused with an lf::Error naming the file: a missing or unreadable file, another
// format, a corrupt or truncated stream, CMYK/YCCK JPEGs, 16-bit grey PNGs. `name` names the
// source in messages (decode_image_bytes).
Image decode_image(const std::string& path);
Image decode_image_bytes(const uint8_t* data, size_t size, const std::string& name);

// Encodes RGB as an 8-bit PNG (for tests, demos and generated data).
void write_png(const Image& image, const std::string& path);

// Pillow's Image.resize(..., BICUBIC) of an RGB image, bit for bit: separable cubic convolution
// (a = -0.5) whose support widens with the downscale factor (antialiasing), coefficients in 22-bit
// fixed point, the horizontal pass first, each pass rounded and clipped to 8 bits.
Image resize_bicubic(const Image& image, int64_t height, int64_t width);

}  // namespace lf::media
