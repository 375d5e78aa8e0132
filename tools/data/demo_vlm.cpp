// make-demo-vlm: the VLM demo's data (tools/demo-vlm). Synthetic 56 x 56 images, each one shape
// (circle, square, triangle) of one colour (red, green, blue, yellow) in one quadrant, and
// single-turn conversations asking for one attribute; a held-out evaluation set and its
// image-ablated twin (the same questions on a blank image); a byte-level tokenizer directory with
// Qwen-VL's special tokens, the Qwen2-VL chat template and a preprocessor_config.json (56 x 56 stays
// 56 x 56: 4 x 4 patches of 14, 4 placeholder tokens).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "commands.h"
#include "loongforge/core/error.h"
#include "loongforge/media/image.h"

namespace lf::data::tools {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const char* kColours[] = {"red", "green", "blue", "yellow"};
const uint8_t kRgb[4][3] = {{215, 40, 40}, {40, 170, 60}, {50, 80, 215}, {225, 205, 40}};
const char* kShapes[] = {"circle", "square", "triangle"};
const char* kPlaces[] = {"top left", "top right", "bottom left", "bottom right"};
const char* kQuestions[] = {"What colour is the shape?", "What shape is it?", "Where is the shape?"};
const char* kAttributes[] = {"colour", "shape", "position"};

constexpr int kSide = 56;

lf::media::Image draw(std::mt19937_64& rng, int colour, int shape, int place, bool blank) {
  lf::media::Image im{kSide, kSide, std::vector<uint8_t>(kSide * kSide * 3)};
  std::uniform_int_distribution<int> noise(-8, 8), jitter(-3, 3), radius(8, 10), tint(-15, 15);
  for (auto& v : im.rgb) v = uint8_t(232 + noise(rng));
  if (blank) return im;
  const double cx = (place % 2) * 28 + 14 + jitter(rng), cy = (place / 2) * 28 + 14 + jitter(rng);
  const double r = radius(rng);
  uint8_t c[3];
  for (int k = 0; k < 3; ++k) c[k] = uint8_t(std::clamp(int(kRgb[colour][k]) + tint(rng), 0, 255));
  for (int y = 0; y < kSide; ++y) {
    for (int x = 0; x < kSide; ++x) {
      const double dx = x + 0.5 - cx, dy = y + 0.5 - cy;
      bool in = false;
      if (shape == 0) in = dx * dx + dy * dy <= r * r;
      if (shape == 1) in = std::abs(dx) <= 0.85 * r && std::abs(dy) <= 0.85 * r;
      if (shape == 2) in = dy >= -r && dy <= r && std::abs(dx) <= (dy + r) / 2;
      if (in)
        for (int k = 0; k < 3; ++k) im.rgb[size_t((y * kSide + x) * 3 + k)] = c[k];
    }
  }
  return im;
}

// GPT-2's byte -> printable character map (the ByteLevel vocabulary's spelling of each byte).
std::string byte_char(int b) {
  static std::vector<int> map = [] {
    std::vector<int> m(256, -1);
    for (int i = '!'; i <= '~'; ++i) m[i] = i;
    for (int i = 0xA1; i <= 0xAC; ++i) m[i] = i;
    for (int i = 0xAE; i <= 0xFF; ++i) m[i] = i;
    int n = 0;
    for (int i = 0; i < 256; ++i)
      if (m[i] < 0) m[i] = 256 + n++;
    return m;
  }();
  const int cp = map[size_t(b)];
  std::string out;
  if (cp < 0x80) {
    out += char(cp);
  } else {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  }
  return out;
}

void write_tokenizer(const std::string& dir) {
  fs::create_directories(dir);
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  json added = json::array();
  int id = 256;
  for (const char* t : {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                        "<|image_pad|>", "<|video_pad|>"})
    added.push_back({{"id", id++}, {"content", t}, {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                     {"normalized", false}, {"special", true}});
  json tok = {{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens", added},
              {"normalizer", nullptr},
              {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
              {"post_processor", nullptr},
              {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
              {"model",
               {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr}, {"fuse_unk", false}, {"byte_fallback", false}, {"ignore_merges", false},
                {"vocab", vocab}, {"merges", json::array()}}}};
  std::ofstream(dir + "/tokenizer.json") << tok.dump();
  std::ofstream(dir + "/tokenizer_config.json")
      << json{{"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"}, {"bos_token", nullptr},
              {"tokenizer_class", "PreTrainedTokenizerFast"}}.dump(1);
  // Qwen2-VL's chat template: an image entry renders <|vision_start|><|image_pad|><|vision_end|>.
  std::ofstream(dir + "/chat_template.jinja")
      << "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
         "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}<|im_start|>system\n"
         "You are a helpful assistant.<|im_end|>\n{% endif %}<|im_start|>{{ message['role'] }}\n"
         "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n{% else %}"
         "{% for content in message['content'] %}"
         "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
         "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: "
         "{% endif %}<|vision_start|><|image_pad|><|vision_end|>"
         "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
         "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
         "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
         "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  std::ofstream(dir + "/preprocessor_config.json")
      << json{{"image_processor_type", "Qwen2VLImageProcessor"}, {"patch_size", 14}, {"merge_size", 2},
              {"temporal_patch_size", 2}, {"size", {{"shortest_edge", kSide * kSide}, {"longest_edge", kSide * kSide}}},
              {"image_mean", {0.48145466, 0.4578275, 0.40821073}}, {"image_std", {0.26862954, 0.26130258, 0.27577711}},
              {"do_resize", true}, {"do_rescale", true}, {"do_normalize", true}, {"resample", 3}}
             .dump(1);
}

}  // namespace

int run_make_demo_vlm(const DemoVlmOptions& o) {
  LF_CHECK(o.train_images > 0 && o.eval_images > 0, "make-demo-vlm: --train-images and --eval-images must be positive");
  fs::create_directories(o.out + "/img");
  write_tokenizer(o.out + "/tok");
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int> pick_colour(0, 3), pick_shape(0, 2), pick_place(0, 3);
  std::ofstream train(o.out + "/train.jsonl"), eval(o.out + "/eval.jsonl"), ablated(o.out + "/eval_blank.jsonl");
  for (int64_t i = 0; i < o.train_images; ++i) {
    const int c = pick_colour(rng), s = pick_shape(rng), p = pick_place(rng);
    const std::string name = "img/train_" + std::to_string(i) + ".png";
    lf::media::write_png(draw(rng, c, s, p, false), o.out + "/" + name);
    const std::string answers[3] = {kColours[c], kShapes[s], kPlaces[p]};
    for (int q = 0; q < 3; ++q)
      train << json{{"messages", {{{"role", "user"}, {"content", std::string("<image>") + kQuestions[q]}},
                                  {{"role", "assistant"}, {"content", answers[q]}}}},
                    {"images", {name}}}
                   .dump()
            << "\n";
  }
  lf::media::write_png(draw(rng, 0, 0, 0, true), o.out + "/img/blank.png");
  for (int64_t i = 0; i < o.eval_images; ++i) {
    const int c = pick_colour(rng), s = pick_shape(rng), p = pick_place(rng);
    const std::string name = "img/eval_" + std::to_string(i) + ".png";
    lf::media::write_png(draw(rng, c, s, p, false), o.out + "/" + name);
    const std::string answers[3] = {kColours[c], kShapes[s], kPlaces[p]};
    for (int q = 0; q < 3; ++q) {
      json line = {{"messages", {{{"role", "user"}, {"content", std::string("<image>") + kQuestions[q]}}}},
                   {"images", {name}},
                   {"answer", answers[q]},
                   {"attribute", kAttributes[q]}};
      eval << line.dump() << "\n";
      line["images"] = {"img/blank.png"};
      ablated << line.dump() << "\n";
    }
  }
  std::printf("make-demo-vlm: %lld training images (x 3 questions), %lld held-out, tokenizer in %s/tok\n",
              static_cast<long long>(o.train_images), static_cast<long long>(o.eval_images), o.out.c_str());
  return 0;
}

}  // namespace lf::data::tools
