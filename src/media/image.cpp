// PNG / JPEG decoding and Pillow-exact bicubic resampling (media/image.h).
#include "loongforge/media/image.h"

#include <jpeglib.h>
#include <png.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "loongforge/core/error.h"

namespace lf::media {
namespace {

[[noreturn]] void fail(const std::string& name, const std::string& what, const std::string& fix) {
  LF_FAIL("image ", name, ": ", what, lf::hint(fix));
}

// Pillow's Image.alpha_composite of a pixel over opaque white (integer, 7 extra bits).
inline uint8_t over_white(uint8_t c, uint8_t a) {
  if (a == 0) return 255;
  const uint32_t coef1 = uint32_t(a) * 128;          // a * 255 * 255 * 2^7 / (255 * 255)
  const uint32_t coef2 = 255u * 128 - coef1;
  uint32_t t = uint32_t(c) * coef1 + 255u * coef2 + (0x80u << 7);
  t = ((t >> 8) + t) >> 8;
  return uint8_t(t >> 7);
}

// ---- PNG -------------------------------------------------------------------------------------

struct PngSource {
  const uint8_t* data;
  size_t size;
  size_t pos;
};

struct PngError {
  char message[256];
};

void png_read_fn(png_structp png, png_bytep out, png_size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (src->pos + n > src->size) png_error(png, "the file ends early (truncated)");
  std::memcpy(out, src->data + src->pos, n);
  src->pos += n;
}

void png_error_fn(png_structp png, png_const_charp msg) {
  auto* err = static_cast<PngError*>(png_get_error_ptr(png));
  std::snprintf(err->message, sizeof(err->message), "%s", msg);
  png_longjmp(png, 1);
}

void png_warning_fn(png_structp, png_const_charp) {}

Image decode_png(const uint8_t* data, size_t size, const std::string& name) {
  PngError err{};
  PngSource src{data, size, 0};
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &err, png_error_fn, png_warning_fn);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!png || !info) {
    png_destroy_read_struct(&png, &info, nullptr);
    fail(name, "out of memory creating the PNG decoder", "retry with more memory");
  }
  Image image;
  std::vector<uint8_t> rgba;
  std::vector<png_bytep> rows;
  int channels = 0;
  bool gray16 = false;
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    fail(name, lf::str("corrupt PNG: ", err.message), "re-encode or remove the file");
  }
  png_set_read_fn(png, &src, png_read_fn);
  png_read_info(png, info);
  const int color = png_get_color_type(png, info);
  const int depth = png_get_bit_depth(png, info);
  image.width = png_get_image_width(png, info);
  image.height = png_get_image_height(png, info);
  if (depth == 16 && (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA)) {
    gray16 = true;
  } else {
    if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (png_get_valid(png, info, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(png);
    if (depth == 16) png_set_strip_16(png);
    if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
    png_set_interlace_handling(png);
    png_read_update_info(png, info);
    channels = png_get_channels(png, info);
    rgba.resize(size_t(image.height) * image.width * channels);
    rows.resize(image.height);
    for (int64_t y = 0; y < image.height; ++y) rows[y] = rgba.data() + size_t(y) * image.width * channels;
    png_read_image(png, rows.data());
    png_read_end(png, nullptr);
  }
  png_destroy_read_struct(&png, &info, nullptr);
  if (gray16) {
    fail(name, "16-bit greyscale PNG is not supported (Pillow reads it as 32-bit integers, not 8-bit RGB)",
         "convert it to 8-bit RGB (e.g. `convert in.png -depth 8 -type TrueColor out.png`)");
  }
  const size_t n = size_t(image.height) * image.width;
  if (channels == 3) {
    image.rgb = std::move(rgba);
  } else if (channels == 4) {
    image.rgb.resize(n * 3);
    for (size_t i = 0; i < n; ++i) {
      const uint8_t a = rgba[i * 4 + 3];
      for (int c = 0; c < 3; ++c) image.rgb[i * 3 + c] = over_white(rgba[i * 4 + c], a);
    }
  } else {
    fail(name, lf::str("unexpected PNG layout with ", channels, " channels after expansion"),
         "re-encode the file as 8-bit RGB");
  }
  return image;
}

// ---- JPEG ------------------------------------------------------------------------------------

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_error_fn(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void jpeg_silence(j_common_ptr, int) {}

Image decode_jpeg(const uint8_t* data, size_t size, const std::string& name) {
  jpeg_decompress_struct cinfo;
  JpegError err{};
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_error_fn;
  err.mgr.emit_message = jpeg_silence;
  Image image;
  bool cmyk = false;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    fail(name, lf::str("corrupt JPEG: ", err.message), "re-encode or remove the file");
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    cmyk = true;
  } else {
    cinfo.out_color_space = JCS_RGB;
    jpeg_start_decompress(&cinfo);
    image.width = cinfo.output_width;
    image.height = cinfo.output_height;
    image.rgb.resize(size_t(image.height) * image.width * 3);
    while (cinfo.output_scanline < cinfo.output_height) {
      JSAMPROW row = image.rgb.data() + size_t(cinfo.output_scanline) * image.width * 3;
      jpeg_read_scanlines(&cinfo, &row, 1);
    }
    jpeg_finish_decompress(&cinfo);
  }
  jpeg_destroy_decompress(&cinfo);
  if (cmyk) fail(name, "CMYK/YCCK JPEG is not supported", "convert the file to RGB first");
  return image;
}

// ---- resampling ------------------------------------------------------------------------------

double bicubic(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

constexpr int kPrecisionBits = 32 - 8 - 2;

// Pillow's precompute_coeffs + normalize_coeffs_8bpc for one axis.
struct Coeffs {
  int64_t ksize = 0;
  std::vector<int64_t> lo, count;
  std::vector<int32_t> k;  // [out, ksize]
};

Coeffs coefficients(int64_t in_size, int64_t out_size) {
  Coeffs c;
  const double scale = double(float(in_size)) / double(out_size);
  const double filterscale = std::max(scale, 1.0);
  const double support = 2.0 * filterscale;
  c.ksize = int64_t(std::ceil(support)) * 2 + 1;
  c.lo.resize(out_size);
  c.count.resize(out_size);
  c.k.assign(size_t(out_size * c.ksize), 0);
  std::vector<double> w(c.ksize);
  for (int64_t xx = 0; xx < out_size; ++xx) {
    const double center = (double(xx) + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int64_t xmin = int64_t(int(center - support + 0.5));
    if (xmin < 0) xmin = 0;
    int64_t xmax = int64_t(int(center + support + 0.5));
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int64_t x = 0; x < xmax; ++x) {
      w[x] = bicubic((double(x + xmin) - center + 0.5) * ss);
      ww += w[x];
    }
    for (int64_t x = 0; x < xmax; ++x) {
      const double v = ww != 0.0 ? w[x] / ww : w[x];
      c.k[xx * c.ksize + x] =
          v < 0 ? int32_t(-0.5 + v * (1 << kPrecisionBits)) : int32_t(0.5 + v * (1 << kPrecisionBits));
    }
    c.lo[xx] = xmin;
    c.count[xx] = xmax;
  }
  return c;
}

inline uint8_t clip8(int32_t v) {
  const int32_t s = v >> kPrecisionBits;  // arithmetic shift, as Pillow's lookup index
  return uint8_t(std::clamp(s, 0, 255));
}

}  // namespace

Image decode_image_bytes(const uint8_t* data, size_t size, const std::string& name) {
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (size >= 8 && std::memcmp(data, kPng, 8) == 0) return decode_png(data, size, name);
  if (size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) return decode_jpeg(data, size, name);
  fail(name, size == 0 ? "the file is empty" : "neither PNG nor JPEG (by its first bytes)",
       "convert the image to PNG or JPEG");
}

Image decode_image(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, "cannot open the file (missing or unreadable)", "check the path and its permissions");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return decode_image_bytes(bytes.data(), bytes.size(), path);
}

void write_png(const Image& image, const std::string& path) {
  LF_CHECK(image.rgb.size() == size_t(image.height * image.width * 3), "write_png: ", image.height, "x",
           image.width, " RGB image with ", image.rgb.size(), " bytes");
  png_image out;
  std::memset(&out, 0, sizeof(out));
  out.version = PNG_IMAGE_VERSION;
  out.width = uint32_t(image.width);
  out.height = uint32_t(image.height);
  out.format = PNG_FORMAT_RGB;
  if (!png_image_write_to_file(&out, path.c_str(), 0, image.rgb.data(), 0, nullptr)) {
    fail(path, lf::str("cannot write PNG: ", out.message), "check that the directory exists and is writable");
  }
}

Image resize_bicubic(const Image& image, int64_t height, int64_t width) {
  LF_CHECK(height > 0 && width > 0, "resize_bicubic: target size ", height, "x", width, " must be positive");
  LF_CHECK(image.height > 0 && image.width > 0, "resize_bicubic: empty image");
  Image cur = image;
  if (width != image.width) {
    const Coeffs c = coefficients(image.width, width);
    Image out{image.height, width, std::vector<uint8_t>(size_t(image.height * width * 3))};
    for (int64_t y = 0; y < image.height; ++y) {
      const uint8_t* row = cur.rgb.data() + size_t(y * image.width * 3);
      for (int64_t xx = 0; xx < width; ++xx) {
        const int32_t* k = &c.k[xx * c.ksize];
        int32_t s[3] = {1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1)};
        for (int64_t x = 0; x < c.count[xx]; ++x) {
          const uint8_t* p = row + (c.lo[xx] + x) * 3;
          for (int ch = 0; ch < 3; ++ch) s[ch] += int32_t(p[ch]) * k[x];
        }
        for (int ch = 0; ch < 3; ++ch) out.rgb[size_t((y * width + xx) * 3 + ch)] = clip8(s[ch]);
      }
    }
    cur = std::move(out);
  }
  if (height != image.height) {
    const Coeffs c = coefficients(image.height, height);
    Image out{height, cur.width, std::vector<uint8_t>(size_t(height * cur.width * 3))};
    for (int64_t yy = 0; yy < height; ++yy) {
      const int32_t* k = &c.k[yy * c.ksize];
      for (int64_t xx = 0; xx < cur.width; ++xx) {
        int32_t s[3] = {1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1), 1 << (kPrecisionBits - 1)};
        for (int64_t y = 0; y < c.count[yy]; ++y) {
          const uint8_t* p = cur.rgb.data() + size_t(((c.lo[yy] + y) * cur.width + xx) * 3);
          for (int ch = 0; ch < 3; ++ch) s[ch] += int32_t(p[ch]) * k[y];
        }
        for (int ch = 0; ch < 3; ++ch) out.rgb[size_t((yy * cur.width + xx) * 3 + ch)] = clip8(s[ch]);
      }
    }
    cur = std::move(out);
  }
  return cur;
}

}  // namespace lf::media
