// jsonl -> indexed datasets: a reader thread cuts the file into chunks of whole lines, worker
// threads parse and tokenize them, and this thread writes results strictly in chunk order (so
// the output does not depend on the worker count).
#include "loongforge/data/preprocess.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <exception>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/data/chat_template.h"
#include "loongforge/data/indexed_dataset.h"
#include "loongforge/data/multimodal.h"
#include "multimodal_internal.h"

namespace lf::data {
namespace {

using Clock = std::chrono::steady_clock;

struct Chunk {
  int64_t seq = 0, first_line = 0;  // first_line: 1-based
  std::string text;                 // whole lines, each ending in '\n'
};

struct ChunkResult {
  // Per output: the tokens of every document of the chunk back to back, and each document's length.
  std::vector<std::vector<int32_t>> tokens, lengths;
  int64_t lines = 0, documents = 0, empty = 0, bytes = 0;
  std::exception_ptr error;
};

// Turns one jsonl line into one document per output (a worker owns one encoder).
class LineEncoder {
 public:
  virtual ~LineEncoder() = default;
  // Appends the line's document to outs[k] for every output k; false when the line is empty
  // (nothing appended).
  virtual bool encode(std::string_view line, int64_t line_no, std::vector<std::vector<int32_t>*>& outs) = 0;
};

nlohmann::json parse_line(std::string_view line, const std::string& input, int64_t line_no, const char* example) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    LF_FAIL(input, ":", line_no, ": malformed JSON line: ", e.what(),
            lf::hint(std::string("each line must be one JSON object, e.g. ") + example));
  }
  LF_CHECK(j.is_object(), input, ":", line_no, ": the line is JSON but not an object");
  return j;
}

// --json-keys: one text document per key.
class TextEncoder final : public LineEncoder {
 public:
  TextEncoder(const PreprocessOptions& o, std::unique_ptr<Tokenizer> tok, std::optional<int32_t> eod)
      : o_(o), tok_(std::move(tok)), eod_(eod), texts_(o.json_keys.size()) {}

  bool encode(std::string_view line, int64_t line_no, std::vector<std::vector<int32_t>*>& outs) override {
    nlohmann::json j = parse_line(line, o_.input, line_no, "{\"text\": \"...\"}");
    bool all_empty = true;
    for (size_t k = 0; k < o_.json_keys.size(); ++k) {
      auto it = j.find(o_.json_keys[k]);
      LF_CHECK(it != j.end(), o_.input, ":", line_no, ": no key \"", o_.json_keys[k], "\"",
               lf::hint("choose the text field with --json-keys"));
      LF_CHECK(it->is_string(), o_.input, ":", line_no, ": key \"", o_.json_keys[k],
               "\" holds ", it->type_name(), ", not a string");
      texts_[k] = it->get<std::string>();
      if (!texts_[k].empty()) all_empty = false;
    }
    if (all_empty) return false;
    for (size_t k = 0; k < o_.json_keys.size(); ++k) {
      auto& out = *outs[k];
      size_t before = out.size();
      try {
        tok_->encode_into(texts_[k], out);
      } catch (const lf::Error& e) {
        LF_FAIL(o_.input, ":", line_no, ": key \"", o_.json_keys[k], "\": ", e.message());
      }
      if (o_.append_eod && out.size() > before) out.push_back(*eod_);
    }
    return true;
  }

 private:
  const PreprocessOptions& o_;
  std::unique_ptr<Tokenizer> tok_;
  std::optional<int32_t> eod_;
  std::vector<std::string> texts_;
};

// --conversations: the chat template's tokens and their assistant mask.
class ConversationEncoder final : public LineEncoder {
 public:
  ConversationEncoder(const PreprocessOptions& o, std::unique_ptr<Tokenizer> tok, const ChatTemplate& tpl)
      : o_(o), tok_(std::move(tok)), tpl_(tpl) {}

  bool encode(std::string_view line, int64_t line_no, std::vector<std::vector<int32_t>*>& outs) override {
    ChatTokens t;
    try {
      t = tpl_.tokenize(line, false, *tok_);
    } catch (const lf::Error& e) {
      LF_FAIL(o_.input, ":", line_no, ": ", e.message(), e.hint().empty() ? lf::hint("") : lf::hint(e.hint()));
    }
    if (t.input_ids.empty()) return false;
    outs[0]->insert(outs[0]->end(), t.input_ids.begin(), t.input_ids.end());
    outs[1]->insert(outs[1]->end(), t.assistant_masks.begin(), t.assistant_masks.end());
    return true;
  }

 private:
  const PreprocessOptions& o_;
  std::unique_ptr<Tokenizer> tok_;
  const ChatTemplate& tpl_;
};

// --multimodal: conversations with media -> tokens with each medium's placeholder expanded, the
// answer mask, and the media's metadata and resized pixels.
class MultimodalEncoder final : public LineEncoder {
 public:
  MultimodalEncoder(const PreprocessOptions& o, std::unique_ptr<Tokenizer> tok, const ChatTemplate& tpl,
                    const MultimodalOptions& mo, std::string root, int32_t image_id, int32_t video_id)
      : o_(o), tok_(std::move(tok)), tpl_(tpl), mo_(mo), root_(std::move(root)), image_id_(image_id),
        video_id_(video_id) {}

  bool encode(std::string_view line, int64_t line_no, std::vector<std::vector<int32_t>*>& outs) override {
    parse_line(line, o_.input, line_no,
               "{\"messages\": [{\"role\": \"user\", \"content\": \"<image>Describe it.\"}, "
               "{\"role\": \"assistant\", \"content\": \"...\"}], \"images\": [\"a.png\"]}");
    MultimodalSample s;
    try {
      s = render_multimodal(line, tpl_, *tok_, mo_, root_, image_id_, video_id_, false);
    } catch (const lf::Error& e) {
      LF_FAIL(o_.input, ":", line_no, ": ", e.message(), e.hint().empty() ? lf::hint("") : lf::hint(e.hint()));
    }
    if (s.tokens.empty()) return false;
    outs[0]->insert(outs[0]->end(), s.tokens.begin(), s.tokens.end());
    outs[1]->insert(outs[1]->end(), s.mask.begin(), s.mask.end());
    for (const MediaRecord& r : s.media) {
      int32_t bits;
      std::memcpy(&bits, &r.seconds_per_grid, 4);
      outs[2]->insert(outs[2]->end(), {int32_t(r.kind), int32_t(r.frames), int32_t(r.height), int32_t(r.width), bits});
      for (const auto& f : r.images) outs[3]->insert(outs[3]->end(), f.rgb.begin(), f.rgb.end());
    }
    return true;
  }

 private:
  const PreprocessOptions& o_;
  std::unique_ptr<Tokenizer> tok_;
  const ChatTemplate& tpl_;
  const MultimodalOptions& mo_;
  std::string root_;
  int32_t image_id_, video_id_;
};

ChunkResult encode_chunk(const Chunk& c, size_t outputs, LineEncoder& enc) {
  ChunkResult r;
  r.tokens.resize(outputs);
  r.lengths.resize(outputs);
  std::vector<std::vector<int32_t>*> outs;
  for (auto& t : r.tokens) outs.push_back(&t);
  int64_t line_no = c.first_line;
  std::vector<size_t> before(outputs);
  for (size_t pos = 0; pos < c.text.size(); ++line_no) {
    size_t nl = c.text.find('\n', pos);
    std::string_view line(c.text.data() + pos, nl - pos);
    pos = nl + 1;
    ++r.lines;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;  // blank line
    for (size_t k = 0; k < outputs; ++k) before[k] = r.tokens[k].size();
    if (!enc.encode(line, line_no, outs)) {
      ++r.empty;
      continue;
    }
    for (size_t k = 0; k < outputs; ++k) r.lengths[k].push_back(static_cast<int32_t>(r.tokens[k].size() - before[k]));
    ++r.documents;
  }
  return r;
}

struct OutputSpec {
  std::string prefix;
  TokenDType dtype;
  int64_t vocab_size;
};

PreprocessStats run(const PreprocessOptions& o, const std::vector<OutputSpec>& specs,
                    const std::function<std::unique_ptr<LineEncoder>()>& make_encoder);

}  // namespace

std::string preprocess_output_prefix(const std::string& prefix, const std::string& key) {
  return prefix + "_" + key + "_document";
}

PreprocessStats preprocess_jsonl(const PreprocessOptions& o, const Tokenizer& tokenizer) {
  LF_CHECK(!o.json_keys.empty(), "--json-keys is empty");
  std::optional<int32_t> eod = tokenizer.eod_id();
  LF_CHECK(!o.append_eod || eod.has_value(), "--append-eod: ", tokenizer.describe(),
           " has no end-of-document token",
           lf::hint("add eos_token to tokenizer_config.json beside tokenizer.json"));
  std::vector<OutputSpec> specs;
  for (const auto& key : o.json_keys)
    specs.push_back({preprocess_output_prefix(o.output_prefix, key), optimal_dtype(tokenizer.vocab_size()),
                     tokenizer.vocab_size()});
  return run(o, specs, [&] { return std::make_unique<TextEncoder>(o, tokenizer.clone(), eod); });
}

PreprocessStats preprocess_conversations(const PreprocessOptions& o, const Tokenizer& tokenizer,
                                         const ChatTemplate& chat_template) {
  LF_CHECK(!o.append_eod, "--append-eod does not apply to --conversations",
           lf::hint("the chat template writes each turn's end token"));
  std::vector<OutputSpec> specs = {
      {preprocess_output_prefix(o.output_prefix, "input_ids"), optimal_dtype(tokenizer.vocab_size()), tokenizer.vocab_size()},
      {preprocess_output_prefix(o.output_prefix, "assistant_masks"), TokenDType::u8, 2}};
  return run(o, specs, [&] { return std::make_unique<ConversationEncoder>(o, tokenizer.clone(), chat_template); });
}

namespace {

int32_t single_token(Tokenizer& tok, const std::string& text, const char* flag) {
  const auto ids = tok.encode(text);
  LF_CHECK(ids.size() == 1, flag, " '", text, "' is ", ids.size(), " tokens in ", tok.describe(),
           ", not one special token", lf::hint("use the vision-language model's tokenizer, or name its placeholder token"));
  return ids[0];
}

}  // namespace

PreprocessStats preprocess_multimodal(const PreprocessOptions& o, const Tokenizer& tokenizer,
                                      const ChatTemplate& chat_template, const MultimodalOptions& mo) {
  LF_CHECK(!o.append_eod, "--append-eod does not apply to --multimodal",
           lf::hint("the chat template writes each turn's end token"));
  auto probe = tokenizer.clone();
  const int32_t image_id = single_token(*probe, mo.image_token, "--image-token");
  const int32_t video_id = single_token(*probe, mo.video_token, "--video-token");
  const std::string root =
      !mo.media_root.empty() ? mo.media_root : std::filesystem::path(o.input).parent_path().string();
  std::vector<OutputSpec> specs = {
      {preprocess_output_prefix(o.output_prefix, "input_ids"), optimal_dtype(tokenizer.vocab_size()), tokenizer.vocab_size()},
      {preprocess_output_prefix(o.output_prefix, "assistant_masks"), TokenDType::u8, 2},
      {preprocess_output_prefix(o.output_prefix, "media_meta"), TokenDType::i32, -1},
      {preprocess_output_prefix(o.output_prefix, "media_pixels"), TokenDType::u8, 256}};
  PreprocessStats stats = run(o, specs, [&] {
    return std::make_unique<MultimodalEncoder>(o, tokenizer.clone(), chat_template, mo, root, image_id, video_id);
  });
  std::ofstream(o.output_prefix + "_media.json") << mm::info_json(mo, image_id, video_id) << "\n";
  return stats;
}

namespace {

PreprocessStats run(const PreprocessOptions& o, const std::vector<OutputSpec>& specs,
                    const std::function<std::unique_ptr<LineEncoder>()>& make_encoder) {
  LF_CHECK(o.workers >= 1, "--workers ", o.workers, " must be >= 1");
  LF_CHECK(!o.output_prefix.empty(), "--output-prefix is empty");
  LF_CHECK(o.chunk_bytes > 0, "chunk size must be positive");
  std::ifstream in(o.input, std::ios::binary);
  LF_CHECK(in.good(), "cannot open input ", o.input);

  const auto t0 = Clock::now();
  PreprocessStats stats;
  stats.workers.resize(static_cast<size_t>(o.workers));
  stats.tokens.assign(specs.size(), 0);
  std::vector<std::unique_ptr<IndexedDatasetBuilder>> builders;
  for (const auto& spec : specs) {
    stats.output_prefixes.push_back(spec.prefix);
    builders.push_back(std::make_unique<IndexedDatasetBuilder>(spec.prefix, spec.dtype, spec.vocab_size));
  }

  // Shared state. At most `window` chunks are read but not yet written, bounding memory.
  const int64_t window = 4 * static_cast<int64_t>(o.workers);
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Chunk> jobs;
  std::map<int64_t, ChunkResult> results;
  int64_t next_to_write = 0, chunks_read = 0;
  bool reading_done = false, abort = false;
  std::exception_ptr reader_error;

  std::thread reader([&] {
    try {
      int64_t line_no = 1;
      std::string line;
      Chunk c;
      auto push = [&] {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return abort || chunks_read - next_to_write < window; });
        if (abort) return false;
        c.seq = chunks_read++;
        jobs.push_back(std::move(c));
        c = Chunk{};
        cv.notify_all();
        return true;
      };
      c.first_line = line_no;
      while (std::getline(in, line)) {
        if (c.text.empty()) c.first_line = line_no;
        c.text.append(line).push_back('\n');
        ++line_no;
        if (static_cast<int64_t>(c.text.size()) >= o.chunk_bytes && !push()) return;
      }
      if (!c.text.empty()) push();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      reader_error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu);
    reading_done = true;
    cv.notify_all();
  });

  std::vector<std::thread> workers;
  for (int w = 0; w < o.workers; ++w) {
    workers.emplace_back([&, w] {
      std::unique_ptr<LineEncoder> encoder;
      for (;;) {
        Chunk c;
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return abort || !jobs.empty() || reading_done; });
          if (abort || jobs.empty()) return;
          c = std::move(jobs.front());
          jobs.pop_front();
        }
        auto start = Clock::now();
        ChunkResult r;
        try {
          if (!encoder) encoder = make_encoder();
          r = encode_chunk(c, specs.size(), *encoder);
          r.bytes = static_cast<int64_t>(c.text.size());
        } catch (...) {
          r.error = std::current_exception();
        }
        std::lock_guard<std::mutex> lock(mu);
        auto& ws = stats.workers[static_cast<size_t>(w)];
        ws.chunks += 1;
        ws.bytes += static_cast<int64_t>(c.text.size());
        ws.busy_s += std::chrono::duration<double>(Clock::now() - start).count();
        results.emplace(c.seq, std::move(r));
        cv.notify_all();
      }
    });
  }

  auto shutdown = [&] {
    {
      std::lock_guard<std::mutex> lock(mu);
      abort = true;
    }
    cv.notify_all();
    reader.join();
    for (auto& t : workers) t.join();
  };

  try {
    auto last_log = Clock::now();
    int64_t written_bytes = 0;
    for (;;) {
      ChunkResult r;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] {
          return results.count(next_to_write) || (reading_done && next_to_write == chunks_read);
        });
        if (!results.count(next_to_write)) {
          if (reader_error) std::rethrow_exception(reader_error);
          break;
        }
        r = std::move(results[next_to_write]);
        results.erase(next_to_write);
      }
      if (r.error) std::rethrow_exception(r.error);
      for (size_t k = 0; k < builders.size(); ++k) {
        size_t pos = 0;
        for (int32_t len : r.lengths[k]) {
          builders[k]->add_sequence(std::span<const int32_t>(r.tokens[k]).subspan(pos, static_cast<size_t>(len)));
          builders[k]->end_document();
          pos += static_cast<size_t>(len);
        }
        stats.tokens[k] += static_cast<int64_t>(r.tokens[k].size());
      }
      stats.lines += r.lines;
      stats.documents += r.documents;
      stats.empty_skipped += r.empty;
      written_bytes += r.bytes;
      {
        std::lock_guard<std::mutex> lock(mu);
        ++next_to_write;
      }
      cv.notify_all();
      if (o.log_interval_s > 0 &&
          std::chrono::duration<double>(Clock::now() - last_log).count() >= o.log_interval_s) {
        last_log = Clock::now();
        double s = std::chrono::duration<double>(last_log - t0).count();
        LF_INFO("preprocess: ", stats.documents, " documents, ", written_bytes >> 20, " MiB in ",
                static_cast<int64_t>(s), " s (", static_cast<double>(written_bytes) / 1e6 / s,
                " MB/s)");
      }
    }
  } catch (...) {
    shutdown();
    throw;
  }
  shutdown();
  for (auto& b : builders) b->finalize();
  for (const auto& w : stats.workers) stats.input_bytes += w.bytes;
  stats.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return stats;
}

}  // namespace
}  // namespace lf::data
