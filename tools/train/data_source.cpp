#include "data_source.h"
#include "data_source_internal.h"

#include <ATen/Functions.h>
#include <ATen/TensorOperators.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <random>
#include <sstream>
#include <tuple>
#include <utility>

#include "loongforge/core/error.h"
#include "loongforge/core/logging.h"
#include "loongforge/data/blended_dataset.h"
#include "loongforge/data/dp_balance.h"
#include "loongforge/data/indexed_dataset.h"
#include "loongforge/data/loader.h"
#include "loongforge/data/sampler.h"
#include "loongforge/data/multimodal.h"
#include "loongforge/data/sft_dataset.h"
#include "loongforge/models/composites/qwen2_5_vl.h"
#include "loongforge/backend/registry.h"

namespace lf::tools {

void add_document_fields(lf::data::Batch& batch, int64_t eod, bool eod_mask_loss, bool reset_position_ids,
                         bool reset_attention_mask) {
  const at::Tensor& tokens = batch.at("tokens");  // [b, s]
  const at::Tensor is_eod = tokens.eq(eod);
  if (eod_mask_loss) {
    at::Tensor mask = batch.find("loss_mask") ? batch.at("loss_mask").clone() : at::ones(tokens.sizes(), at::kFloat);
    mask.masked_fill_(is_eod, 0.0);
    batch.set("loss_mask", mask, 1);
  }
  if (!reset_position_ids && !reset_attention_mask) return;
  // The document of position k: the eods strictly before it (an eod closes its own document).
  const at::Tensor doc = (is_eod.to(at::kLong).cumsum(1) - is_eod.to(at::kLong)).contiguous();
  if (reset_attention_mask) batch.set("document_ids", doc, 1);
  if (reset_position_ids) {
    const int64_t b = tokens.size(0), s = tokens.size(1);
    at::Tensor pos = at::empty({b, s}, at::kLong);
    const int64_t* d = doc.data_ptr<int64_t>();
    int64_t* p = pos.data_ptr<int64_t>();
    for (int64_t i = 0; i < b; ++i) {
      int64_t start = 0;
      for (int64_t k = 0; k < s; ++k) {
        if (k > 0 && d[i * s + k] != d[i * s + k - 1]) start = k;
        p[i * s + k] = k - start;
      }
    }
    batch.set("position_ids", pos, 1);
  }
}

namespace {

struct BatchOptions {
  std::optional<int64_t> eod;
  bool eod_mask_loss = false, reset_position_ids = false, reset_attention_mask = false, mock = false;
  uint64_t seed = 0;
  const lf::models::ModelPlan* plan = nullptr;
};


// One split's micro-batches for this DP rank from a token dataset. rewind() starts over from the
// first sample, so every evaluation sees the same held-out batches.
class LoaderSource final : public lf::train::BatchSource {
 public:
  LoaderSource(std::shared_ptr<const lf::data::SampleDataset> dataset, int64_t micro_batch, int dp_rank, int dp_size,
               int workers, std::string split, BatchOptions options)
      : dataset_(std::move(dataset)), micro_batch_(micro_batch), dp_rank_(dp_rank), dp_size_(dp_size),
        workers_(workers), split_(std::move(split)), options_(options) {
    rewind();
  }
  lf::data::Batch next() override {
    auto rows = loader_->next();
    LF_CHECK(rows.has_value(), "the ", split_, " split ran out of samples (", dataset_->size(), " built)",
             lf::hint("this is a bug in the sample count; please report it"));
    const int64_t b = rows->micro_batch_size, s = rows->sample_length - 1;
    auto t = at::from_blob(rows->tokens.data(), {b, rows->sample_length}, at::TensorOptions().dtype(at::kLong)).clone();
    lf::data::Batch batch;
    batch.set("tokens", t.narrow(1, 0, s).contiguous(), 1);
    batch.set("labels", t.narrow(1, 1, s).contiguous(), 1);
    batch.set("loss_mask", at::ones({b, s}, at::kFloat), 1);
    batch.sample_indices = rows->sample_indices;
    if (options_.eod)
      add_document_fields(batch, *options_.eod, options_.eod_mask_loss, options_.reset_position_ids,
                          options_.reset_attention_mask);
    if (options_.mock) options_.plan->add_mock_fields(batch, options_.seed);
    return batch;
  }
  void rewind() override { seek(0); }
  // Megatron's sampler state: the global consumed-sample count (any DP size continues it).
  bool seek(int64_t consumed_samples) override {
    loader_.reset();
    lf::data::PretrainingSampler::State state;
    state.consumed_samples = consumed_samples;
    lf::data::LoaderOptions lo;
    lo.workers = workers_;
    loader_ = std::make_unique<lf::data::BackgroundLoader>(
        dataset_, lf::data::PretrainingSampler(dataset_->size(), micro_batch_, dp_rank_, dp_size_, state), lo);
    return true;
  }

 private:
  std::shared_ptr<const lf::data::SampleDataset> dataset_;
  int64_t micro_batch_;
  int dp_rank_, dp_size_, workers_;
  std::string split_;
  BatchOptions options_;
  std::unique_ptr<lf::data::BackgroundLoader> loader_;
};

// Models that read no tokens (--mock-data): batches synthesised by the model's plan from the
// global sample indices this DP rank's sampler hands out.
class SyntheticSource final : public lf::train::BatchSource {
 public:
  SyntheticSource(const lf::models::ModelPlan& plan, int64_t samples, int64_t micro_batch, int dp_rank, int dp_size,
                  uint64_t seed)
      : plan_(plan), samples_(samples), micro_batch_(micro_batch), dp_rank_(dp_rank), dp_size_(dp_size), seed_(seed) {
    rewind();
  }
  lf::data::Batch next() override {
    auto indices = sampler_->next_micro_batch();
    LF_CHECK(indices.has_value(), "synthetic data ran out of samples (", samples_, ")");
    lf::data::Batch batch;
    batch.sample_indices = *indices;
    plan_.add_mock_fields(batch, seed_);
    return batch;
  }
  void rewind() override { seek(0); }
  bool seek(int64_t consumed) override {
    sampler_ = sampler_at(samples_, micro_batch_, dp_rank_, dp_size_, consumed);
    return true;
  }

 private:
  const lf::models::ModelPlan& plan_;
  int64_t samples_, micro_batch_;
  int dp_rank_, dp_size_;
  uint64_t seed_;
  std::unique_ptr<lf::data::PretrainingSampler> sampler_;
};

// SFT: one conversation per sample from a `loongforge-data preprocess --conversations` store
// (<prefix>_input_ids_document + <prefix>_assistant_masks_document, one sequence each). The
// conversations [begin, end) of the split, in a new permutation every epoch (seeded), for as many
// samples as the run needs. A sample of n tokens predicts tokens 1..n-1 from 0..n-2, the loss
// counting where the predicted token is an answer token; rows are padded to seq_length (labels
// -100, loss_mask 0) and conversations longer than seq_length + 1 tokens are cut.
class ConversationStore {
 public:
  virtual ~ConversationStore() = default;
  virtual int64_t size() const = 0;
  virtual int64_t length(int64_t i) const = 0;
  // The first `count` tokens and mask values of conversation i; ids are checked against the
  // model's vocabulary.
  virtual void read(int64_t i, int64_t count, int64_t* tokens, int64_t* mask) const = 0;
  // The media of a micro-batch's conversations (row order) as batch fields; none for text.
  virtual void add_media(const std::vector<int64_t>& conversations, lf::data::Batch& batch) const {}

 protected:
  static void check_vocab(int64_t id, int64_t vocab, const std::string& prefix, int64_t i, int64_t k) {
    LF_CHECK(vocab <= 0 || (id >= 0 && id < vocab), "SFT store ", prefix, ": conversation ", i, " token ", k, " is id ",
             id, ", outside the model's vocabulary of ", vocab,
             lf::hint("preprocess with the tokenizer of the model being trained"));
  }
};

class SftConversations final : public ConversationStore {
 public:
  SftConversations(const std::string& prefix, int64_t vocab_size)
      : data_(prefix), prefix_(prefix), vocab_(vocab_size) {}
  int64_t size() const override { return data_.size(); }
  int64_t length(int64_t i) const override { return data_.length(i); }
  void read(int64_t i, int64_t count, int64_t* tokens, int64_t* mask) const override {
    std::vector<int32_t> t;
    std::vector<uint8_t> m;
    data_.read(i, t, m);
    for (int64_t k = 0; k < count; ++k) {
      check_vocab(t[static_cast<size_t>(k)], vocab_, prefix_, i, k);
      tokens[k] = t[static_cast<size_t>(k)];
      mask[k] = m[static_cast<size_t>(k)];
    }
  }

 private:
  lf::data::SftDataset data_;
  std::string prefix_;
  int64_t vocab_;
};

// A `preprocess --multimodal` store, less the samples longer than seq_length + 1 tokens (a cut
// would split a medium's placeholders from its pixels): conversation i of this view is stored
// sample kept_[i]. Media become pixel_values / image_grid_thw and pixel_values_videos /
// video_grid_thw / second_per_grid_ts (the Qwen-VL processors' fields), normalised and cut into
// patch rows here, in the micro-batch's row order.
class MultimodalConversations final : public ConversationStore {
 public:
  // videos_why: non-empty when the model cannot take the store's videos (why).
  MultimodalConversations(const std::string& prefix, int64_t vocab_size, int64_t seq_length, std::string videos_why)
      : data_(prefix), prefix_(prefix), vocab_(vocab_size), videos_why_(std::move(videos_why)) {
    for (int64_t i = 0; i < data_.size(); ++i) {
      if (data_.length(i) <= seq_length + 1) kept_.push_back(i);
      else ++dropped_;
    }
  }
  int64_t size() const override { return static_cast<int64_t>(kept_.size()); }
  int64_t length(int64_t i) const override { return data_.length(kept_.at(static_cast<size_t>(i))); }
  int64_t dropped() const { return dropped_; }
  const lf::data::MultimodalStoreInfo& info() const { return data_.info(); }
  void read(int64_t i, int64_t count, int64_t* tokens, int64_t* mask) const override {
    std::vector<int32_t> t;
    std::vector<uint8_t> m;
    data_.read_text(kept_.at(static_cast<size_t>(i)), t, m);  // the media are read by add_media only
    for (int64_t k = 0; k < count; ++k) {
      check_vocab(t[static_cast<size_t>(k)], vocab_, prefix_, kept_[static_cast<size_t>(i)], k);
      tokens[k] = t[static_cast<size_t>(k)];
      mask[k] = m[static_cast<size_t>(k)];
    }
  }
  void add_media(const std::vector<int64_t>& conversations, lf::data::Batch& batch) const override {
    std::vector<lf::data::MediaRecord> media;
    for (int64_t c : conversations)
      for (auto& m : data_.read(kept_.at(static_cast<size_t>(c))).media) {
        LF_CHECK(m.kind != lf::data::MediaRecord::kVideo || videos_why_.empty(), "multimodal store ", prefix_,
                 ": sample ", kept_.at(static_cast<size_t>(c)), " holds a video, but ", videos_why_,
                 lf::hint("train this model on conversations with images only"));
        media.push_back(std::move(m));
      }
    lf::models::Qwen25Vl::set_media_fields(lf::models::Qwen25Vl::media_of_records(media, data_.info().vision), batch);
  }

 private:
  lf::data::MultimodalDataset data_;
  std::string prefix_;
  int64_t vocab_;
  std::string videos_why_;
  std::vector<int64_t> kept_;
  int64_t dropped_ = 0;
};

// --use-vlm-dp-balance settings of the train split (SftOptions' balance fields).
struct SftBalance {
  bool enabled = false;
  std::optional<lf::data::CostModel> given;
  int64_t warmup_iters = 5, global_batch = 0, log_interval = 1;
  lf::backend::Communicator* group = nullptr;
  c10::Device device = c10::kCPU;
  bool log = false;
};

class SftSource final : public lf::train::BatchSource {
 public:
  SftSource(std::shared_ptr<const ConversationStore> data, int64_t begin, int64_t end, int64_t samples,
            int64_t micro_batch, int64_t seq_length, int64_t pad_id, int dp_rank, int dp_size, uint64_t seed,
            bool shuffle, bool pack, std::string split, SftBalance balance = {})
      : data_(std::move(data)), begin_(begin), end_(end), samples_(samples), micro_batch_(micro_batch),
        seq_(seq_length), pad_(pad_id), dp_rank_(dp_rank), dp_size_(dp_size), seed_(seed), shuffle_(shuffle),
        pack_(pack), split_(std::move(split)), balance_(std::move(balance)) {
    LF_CHECK(end_ > begin_, "the ", split_, " split of the SFT data has no conversations");
    if (balance_.enabled) {
      LF_CHECK(!pack_ && dp_size_ > 1 && balance_.global_batch % (micro_batch_ * dp_size_) == 0,
               "--use-vlm-dp-balance needs unpacked conversations, DP > 1 and a global batch of whole micro-batch "
               "steps");
      model_ = balance_.given;
      if (balance_.log) {
        if (model_)
          LF_INFO("VLM DP balance: every global batch of ", balance_.global_batch, " samples planned over ", dp_size_,
                  " DP ranks with the given cost a*sum(len^2) + b*sum(len) + c*samples, a ", model_->a, ", b ",
                  model_->b, ", c ", model_->c);
        else
          LF_INFO("VLM DP balance: Megatron's split for ", balance_.warmup_iters,
                  " warm-up iterations, then every global batch of ", balance_.global_batch, " samples planned over ",
                  dp_size_, " DP ranks with a cost model fitted to the measured forward/backward times of iterations 2..",
                  balance_.warmup_iters);
      }
    }
    rewind();
  }
  void report_compute_seconds(double seconds) override {
    if (!balance_.enabled) return;
    // Every --log-interval-th iteration: the ranks' measured times in the log, what the plan is for
    // (every rank knows the iteration, so all take part in the gather).
    const int64_t iteration = consumed_ / balance_.global_batch;
    if (balance_.group && iteration % balance_.log_interval == 0) {
      const auto dopt = at::TensorOptions().dtype(at::kDouble);
      at::Tensor in = at::full({1}, seconds, dopt).to(balance_.device);
      at::Tensor all = at::empty({balance_.group->size()}, dopt.device(balance_.device));
      balance_.group->all_gather(all, in);
      all = all.cpu();
      if (balance_.log) {
        const double mx = all.max().item<double>(), mn = all.min().item<double>(), mean = all.mean().item<double>();
        LF_INFO("VLM DP balance | iteration ", iteration, " | measured forward/backward seconds per rank ", mn, "..",
                mx, ", max/mean ", mean > 0 ? mx / mean : 1.0, step_planned_ ? " (planned)" : " (Megatron's split)");
      }
    }
    // Warm-up observations for the fit; the first iteration (allocations, first calls) is left out.
    if (model_ || fit_done_ || steps_ < 2) return;
    auto o = step_features_;
    o.seconds = seconds;
    observations_.push_back(o);
  }
  lf::data::Batch next() override {
    std::optional<std::vector<int64_t>> indices;
    if (balance_.enabled) {
      if (step_pos_ == 0) plan_step();
      indices = step_batches_[static_cast<size_t>(step_pos_)];
      step_pos_ = (step_pos_ + 1) % static_cast<int64_t>(step_batches_.size());
    } else {
      indices = sampler_->next_micro_batch();
    }
    LF_CHECK(indices.has_value(), "the SFT ", split_, " split ran out of samples (", samples_, ")",
             lf::hint("this is a bug in the sample count; please report it"));
    const int64_t b = static_cast<int64_t>(indices->size()), s = seq_;
    at::Tensor tokens = at::full({b, s}, pad_, at::kLong), labels = at::full({b, s}, -100, at::kLong),
               mask = at::zeros({b, s}, at::kFloat), positions = at::zeros({b, s}, at::kLong),
               documents = at::zeros({b, s}, at::kLong);
    std::vector<int64_t> t(static_cast<size_t>(s + 1)), m(static_cast<size_t>(s + 1)), in_rows;
    for (int64_t r = 0; r < b; ++r) {
      auto* tp = tokens.data_ptr<int64_t>() + r * s;
      auto* lp = labels.data_ptr<int64_t>() + r * s;
      auto* mp = mask.data_ptr<float>() + r * s;
      auto* pp = positions.data_ptr<int64_t>() + r * s;
      auto* dp = documents.data_ptr<int64_t>() + r * s;
      // A conversation of n tokens takes n - 1 positions (its last token is only a label).
      int64_t at_pos = 0, doc = 0;
      for (int64_t conv : row((*indices)[static_cast<size_t>(r)])) {
        const int64_t n = std::min(data_->length(conv), s + 1);
        if (n < 2) continue;  // nothing to predict
        in_rows.push_back(conv);
        data_->read(conv, n, t.data(), m.data());
        for (int64_t k = 0; k + 1 < n; ++k) {
          tp[at_pos + k] = t[static_cast<size_t>(k)];
          lp[at_pos + k] = t[static_cast<size_t>(k + 1)];
          mp[at_pos + k] = m[static_cast<size_t>(k + 1)] != 0 ? 1.0f : 0.0f;
          pp[at_pos + k] = k;
          dp[at_pos + k] = doc;
        }
        at_pos += n - 1;
        ++doc;
      }
      for (int64_t k = at_pos; k < s; ++k) pp[k] = k - at_pos, dp[k] = doc;  // the padding: a document of its own
    }
    lf::data::Batch batch;
    batch.set("tokens", tokens, 1);
    batch.set("labels", labels, 1);
    batch.set("loss_mask", mask, 1);
    if (pack_) {
      // Several conversations per row: positions restart and attention stays within each.
      batch.set("position_ids", positions, 1);
      batch.set("document_ids", documents, 1);
    }
    data_->add_media(in_rows, batch);
    batch.sample_indices = *indices;
    return batch;
  }
  void rewind() override { seek(0); }
  bool seek(int64_t consumed) override {
    sampler_ = sampler_at(samples_, micro_batch_, dp_rank_, dp_size_, consumed);
    if (balance_.enabled) {
      LF_CHECK(consumed % balance_.global_batch == 0, "--use-vlm-dp-balance resumes at a global batch boundary; ",
               consumed, " consumed samples is not a multiple of the global batch size ", balance_.global_batch);
      consumed_ = consumed;
      step_pos_ = 0;
    }
    return true;
  }

 private:
  // --use-vlm-dp-balance: the next global batch's micro-batches for this rank. Position p of the
  // global batch is the sample Megatron's sampler gives rank p / (M mb) in micro-batch
  // (p % (M mb)) / mb, row p % mb (M micro-batches of mb rows a rank), so that
  // lf::data::naive_placement is the unbalanced split; the plan's rank r list, cut at its
  // micro-batch offsets, is what rank r reads.
  void plan_step() {
    namespace ld = lf::data;
    const int64_t g = balance_.global_batch, mb = micro_batch_, dp = dp_size_, m = g / (mb * dp);
    LF_CHECK(consumed_ + g <= samples_, "the SFT ", split_, " split ran out of samples (", samples_, ")",
             lf::hint("this is a bug in the sample count; please report it"));
    std::vector<int64_t> sample(static_cast<size_t>(g)), length(static_cast<size_t>(g));
    for (int64_t k = 0; k < g; ++k) {  // in sample order (row() caches one epoch's order)
      const int64_t j = k / (mb * dp), r = (k % (mb * dp)) / mb, i = k % mb;
      const int64_t p = r * m * mb + j * mb + i;
      sample[static_cast<size_t>(p)] = consumed_ + k;
      length[static_cast<size_t>(p)] = std::min(data_->length(row(consumed_ + k)[0]), seq_ + 1);
    }
    const int64_t iteration = consumed_ / g + 1;
    consumed_ += g;
    ++steps_;
    if (!model_ && !fit_done_ && steps_ > balance_.warmup_iters) fit();
    step_planned_ = false;
    std::vector<int64_t> mine;  // positions, in micro-batch order
    std::vector<int64_t> offsets;
    if (model_) {
      ld::BalanceOptions opt;
      opt.equal_counts = true;
      opt.micro_batches_per_rank = static_cast<int>(m);
      const auto plan = ld::plan_balance(length, static_cast<int>(dp), *model_, opt);
      step_planned_ = !plan.skipped;
      const auto& rp = plan.ranks[static_cast<size_t>(dp_rank_)];
      mine = rp.samples;
      offsets = rp.micro_batch_offsets;
      if (!plan_checked_) check_plan(plan);
      if (balance_.log && (!logged_ || iteration % balance_.log_interval == 0)) {
        logged_ = true;
        int64_t max_len = 0, min_len = std::numeric_limits<int64_t>::max();
        for (const auto& q : plan.ranks) max_len = std::max(max_len, q.packed_length), min_len = std::min(min_len, q.packed_length);
        LF_INFO("VLM DP balance | iteration ", iteration, " | rank cost max/mean: Megatron's split ",
                plan.stats.naive_max_over_mean, ", balanced ", plan.stats.balanced_max_over_mean,
                plan.skipped ? " (Megatron's split kept: within 1.05 or no better plan)" : "", " | ",
                plan.stats.moved_samples, " of ", g, " samples moved | rank tokens ", min_len, "..", max_len);
      }
    } else {
      mine.resize(static_cast<size_t>(m * mb));
      for (int64_t q = 0; q < m * mb; ++q) mine[static_cast<size_t>(q)] = dp_rank_ * m * mb + q;
      for (int64_t j = 0; j <= m; ++j) offsets.push_back(j * mb);
    }
    step_batches_.assign(static_cast<size_t>(m), {});
    step_features_ = {};
    for (int64_t j = 0; j < m; ++j)
      for (int64_t q = offsets[static_cast<size_t>(j)]; q < offsets[static_cast<size_t>(j + 1)]; ++q) {
        const int64_t p = mine[static_cast<size_t>(q)];
        step_batches_[static_cast<size_t>(j)].push_back(sample[static_cast<size_t>(p)]);
        const double l = static_cast<double>(length[static_cast<size_t>(p)]);
        step_features_.sum_sq_length += l * l;
        step_features_.sum_length += l;
        step_features_.n_samples += 1;
      }
  }
  // After the warm-up: every rank's observations gathered, fitted on rank 0, a, b, c broadcast
  // (a degenerate fit keeps Megatron's split, with the reason in the log).
  void fit() {
    fit_done_ = true;
    auto* g = balance_.group;
    LF_CHECK(g != nullptr, "--use-vlm-dp-balance: no process group to fit the cost model over");
    const auto dopt = at::TensorOptions().dtype(at::kDouble);
    std::vector<double> mine;
    for (const auto& o : observations_) mine.insert(mine.end(), {o.sum_sq_length, o.sum_length, o.n_samples, o.seconds});
    at::Tensor in = at::tensor(mine, dopt).to(balance_.device);
    at::Tensor all = at::empty({static_cast<int64_t>(mine.size()) * g->size()}, dopt.device(balance_.device));
    g->all_gather(all, in);
    all = all.cpu().contiguous();
    std::vector<double> result{0, 0, 0, 0};
    std::string why;
    if (g->rank() == 0) {
      std::vector<lf::data::CostObservation> obs;
      const double* v = all.data_ptr<double>();
      for (int64_t k = 0; k + 3 < all.numel(); k += 4) obs.push_back({v[k], v[k + 1], v[k + 2], v[k + 3]});
      try {
        const auto c = lf::data::fit_cost_model(obs);
        result = {1, c.a, c.b, c.c};
      } catch (const lf::Error& e) {
        why = e.what();
      }
      if (balance_.log) {
        if (result[0] > 0)
          LF_INFO("VLM DP balance: cost model fitted from ", obs.size(), " observations (ranks x iterations 2..",
                  balance_.warmup_iters, "): seconds = ", result[1], " * sum(len^2) + ", result[2], " * sum(len) + ",
                  result[3], " * samples; balancing from iteration ", consumed_ / balance_.global_batch);
        else
          LF_WARN("VLM DP balance: the cost model cannot be fitted from the warm-up's ", obs.size(),
                  " observations, so Megatron's split is kept for the whole run: ", why);
      }
    }
    at::Tensor r = at::tensor(result, dopt).to(balance_.device);
    g->broadcast(r, 0);
    r = r.cpu();
    if (r[0].item<double>() > 0) model_ = lf::data::CostModel{r[1].item<double>(), r[2].item<double>(), r[3].item<double>()};
  }
  // Every rank must compute the same plan (same lengths, same cost model, same binary): the first
  // plan's checksum is compared over the group, once.
  void check_plan(const lf::data::BalanceResult& plan) {
    plan_checked_ = true;
    if (!balance_.group) return;
    uint64_t h = 1469598103934665603ull;
    auto mix = [&](int64_t v) { h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull; };
    for (const auto& rp : plan.ranks) {
      for (int64_t v : rp.samples) mix(v);
      for (int64_t v : rp.micro_batch_offsets) mix(v);
      mix(-1);
    }
    const auto lopt = at::TensorOptions().dtype(at::kLong);
    at::Tensor in = at::tensor({static_cast<int64_t>(h >> 1)}, lopt).to(balance_.device);
    at::Tensor all = at::empty({balance_.group->size()}, lopt.device(balance_.device));
    balance_.group->all_gather(all, in);
    all = all.cpu();
    for (int64_t k = 0; k < all.numel(); ++k)
      LF_CHECK(all[k].item<int64_t>() == static_cast<int64_t>(h >> 1), "--use-vlm-dp-balance: rank ",
               balance_.group->ranks()[static_cast<size_t>(k)], " planned a different global batch than rank ",
               balance_.group->ranks()[static_cast<size_t>(balance_.group->rank())],
               lf::hint("every rank must run the same binary on the same store; this is a bug, please report it"));
  }

  // The split's conversations in epoch e's order: a seeded permutation (in order for validation).
  std::vector<int64_t> epoch_order(int64_t epoch) const {
    return epoch_permutation(begin_, end_, shuffle_, seed_, epoch);
  }
  // Sample k's conversations. Unpacked: epoch k / n, position k % n. Packed: each epoch's order cut
  // greedily into rows of at most seq_length positions (a conversation never splits; one longer
  // than the row is cut and alone), the epochs' rows one after another.
  std::vector<int64_t> row(int64_t k) {
    const int64_t n = end_ - begin_;
    if (!pack_) {
      if (k / n != order_epoch_) order_ = epoch_order(k / n), order_epoch_ = k / n;
      return {order_[static_cast<size_t>(k % n)]};
    }
    int64_t first = 0;  // the first sample of epoch e
    for (int64_t e = 0;; ++e) {
      if (e >= static_cast<int64_t>(rows_.size())) {
        std::vector<std::vector<int64_t>> rows;
        int64_t used = 0;
        for (int64_t conv : epoch_order(e)) {
          const int64_t need = std::min(data_->length(conv), seq_ + 1) - 1;
          if (rows.empty() || used + need > seq_) rows.emplace_back(), used = 0;
          rows.back().push_back(conv);
          used += std::max<int64_t>(need, 0);
        }
        rows_.push_back(std::move(rows));
      }
      const int64_t count = static_cast<int64_t>(rows_[static_cast<size_t>(e)].size());
      if (k < first + count) return rows_[static_cast<size_t>(e)][static_cast<size_t>(k - first)];
      first += count;
    }
  }

  std::shared_ptr<const ConversationStore> data_;
  int64_t begin_, end_, samples_, micro_batch_, seq_, pad_;
  int dp_rank_, dp_size_;
  uint64_t seed_;
  bool shuffle_, pack_;
  std::string split_;
  std::unique_ptr<lf::data::PretrainingSampler> sampler_;
  std::vector<int64_t> order_;
  int64_t order_epoch_ = -1;
  std::vector<std::vector<std::vector<int64_t>>> rows_;  // packed: per epoch, its rows
  // --use-vlm-dp-balance
  SftBalance balance_;
  std::optional<lf::data::CostModel> model_;  // given, or fitted (none: Megatron's split)
  int64_t consumed_ = 0, steps_ = 0, step_pos_ = 0;
  std::vector<std::vector<int64_t>> step_batches_;  // this rank's micro-batches of the current step
  lf::data::CostObservation step_features_;         // their features (seconds unset)
  std::vector<lf::data::CostObservation> observations_;
  bool fit_done_ = false, plan_checked_ = false, logged_ = false, step_planned_ = false;
};

}  // namespace

DataSources make_sft_sources(const SftOptions& o) {
  const std::string tokens_idx = lf::data::idx_path(lf::data::SftDataset::tokens_prefix(o.prefix));
  LF_CHECK(std::filesystem::exists(tokens_idx), "--training-phase sft: ", tokens_idx, " does not exist",
           lf::hint("data.data_path must be the --output-prefix of `loongforge-data preprocess --conversations` "
                    "(or --multimodal)"));
  const bool multimodal = lf::data::MultimodalDataset::exists(o.prefix);
  LF_CHECK(multimodal == o.media, "--training-phase sft: ", o.prefix, multimodal ? " is a multimodal store (media) but the model reads no media"
                                                                                : " holds text conversations but the model reads media",
           lf::hint(multimodal ? "train a vision-language model (e.g. model type qwen2_5_vl) on it"
                               : "preprocess the conversations with `loongforge-data preprocess --multimodal`"));
  std::shared_ptr<const ConversationStore> data;
  if (multimodal) {
    auto mm = std::make_shared<const MultimodalConversations>(o.prefix, o.vocab_size, o.seq_length, o.videos_why);
    LF_CHECK(o.image_token_id < 0 || mm->info().image_token_id == o.image_token_id, "multimodal store ", o.prefix,
             " uses image token id ", mm->info().image_token_id, " but model.image_token_id is ", o.image_token_id,
             lf::hint("set model.image_token_id (and video_token_id) to the tokenizer's ids"));
    LF_CHECK(o.video_token_id < 0 || mm->info().video_token_id == o.video_token_id, "multimodal store ", o.prefix,
             " uses video token id ", mm->info().video_token_id, " but model.video_token_id is ", o.video_token_id,
             lf::hint("set model.video_token_id to the tokenizer's id"));
    const auto& v = mm->info().vision;
    for (const auto& [what, store, model] : {std::tuple{"patch_size", v.patch_size, o.patch_size},
                                             std::tuple{"temporal_patch_size", v.temporal_patch_size, o.temporal_patch_size},
                                             std::tuple{"spatial_merge_size", v.merge_size, o.merge_size}})
      LF_CHECK(model == 0 || store == model, "multimodal store ", o.prefix, " cut its media with ", what, " ", store,
               " but model.vision_encoder.", what, " is ", model,
               lf::hint("preprocess the conversations again with the model's preprocessor_config.json "
                        "(loongforge-data preprocess --multimodal --tokenizer-model DIR), or set the model's " +
                        std::string(what)));
    LF_CHECK(mm->size() > 0, "multimodal store ", o.prefix, ": all ", mm->dropped(),
             " samples are longer than --seq-length + 1 = ", o.seq_length + 1, " tokens",
             lf::hint("raise --seq-length, or lower --max-pixels when preprocessing"));
    if (o.log && mm->dropped() > 0)
      LF_WARN(mm->dropped(), " multimodal samples are longer than --seq-length + 1 = ", o.seq_length + 1,
              " tokens and are skipped (a cut would separate placeholders from their pixels)");
    data = mm;
  } else {
    data = std::make_shared<const SftConversations>(o.prefix, o.vocab_size);
  }
  const int64_t n = data->size();
  // Contiguous ranges of conversations by the split proportions (train first), as Megatron splits
  // documents.
  double total = 0;
  for (double w : o.split) total += w;
  LF_CHECK(total > 0, "the SFT split proportions sum to ", total);
  std::vector<int64_t> bounds{0};
  double acc = 0;
  for (size_t k = 0; k < 3; ++k) {
    acc += k < o.split.size() ? o.split[k] : 0.0;
    bounds.push_back(k == 2 ? n
                            : std::min<int64_t>(n, static_cast<int64_t>(std::llround(acc / total * static_cast<double>(n)))));
  }
  int64_t cut = 0;
  for (int64_t i = bounds[0]; i < bounds[1]; ++i) cut += data->length(i) > o.seq_length + 1;
  if (o.log) {
    LF_INFO(multimodal ? "SFT multimodal data " : "SFT data ", o.prefix, ": ", n, " conversations (train ",
            bounds[1] - bounds[0], ", valid ",
            bounds[2] - bounds[1], "), ",
            o.pack ? "packed into rows of " : "one per row padded to ", o.seq_length, " tokens");
    if (cut > 0)
      LF_WARN(cut, " training conversations are longer than --seq-length + 1 = ", o.seq_length + 1,
              " tokens and are cut (their tail's answer tokens do not train)");
  }
  DataSources out;
  SftBalance balance;
  if (o.balance) {
    LF_CHECK(multimodal, "--use-vlm-dp-balance balances multimodal stores; ", o.prefix, " holds text conversations",
             lf::hint("drop --use-vlm-dp-balance"));
    balance.enabled = true;
    if (!o.balance_cost.empty()) balance.given = lf::data::CostModel{o.balance_cost[0], o.balance_cost[1], o.balance_cost[2]};
    balance.warmup_iters = o.balance_warmup_iters;
    balance.global_batch = o.global_batch;
    balance.log_interval = std::max<int64_t>(1, o.log_interval);
    balance.group = o.group;
    balance.device = o.device;
    balance.log = o.log;
  }
  out.train = std::make_unique<SftSource>(data, bounds[0], bounds[1], o.train_samples, o.micro_batch, o.seq_length,
                                          o.pad_id, o.dp_rank, o.dp_size, o.seed, true, o.pack, "train", balance);
  if (o.valid_samples > 0 && bounds[2] > bounds[1])
    out.valid = std::make_unique<SftSource>(data, bounds[1], bounds[2], o.valid_samples, o.micro_batch, o.seq_length,
                                            o.pad_id, o.dp_rank, o.dp_size, o.seed, false, o.pack, "valid");
  return out;
}

namespace {

DataSources make_sft_sources_for(const lf::config::JobConfig& job, const lf::models::ModelPlan& plan,
                                 const lf::dist::ParallelContext& ctx, std::optional<int64_t> eod) {
  const auto& t = job.training;
  const auto& d = job.data;
  LF_CHECK(d.data_path.size() == 1, "--training-phase sft reads one conversations store, data.data_path has ",
           d.data_path.size(), " entries",
           lf::hint("preprocess every conversations file into one store (loongforge-data preprocess --conversations) "
                    "and pass its prefix"));
  const int dp = ctx.dp_size();
  SftOptions o;
  o.prefix = d.data_path[0];
  o.split = d.split;
  o.seq_length = t.seq_length;
  o.micro_batch = t.micro_batch_size;
  o.train_samples = t.train_iters * t.global_batch_size.value_or(t.micro_batch_size * dp);
  o.valid_samples = t.eval_iters > 0 ? t.eval_iters * t.micro_batch_size * dp : 0;
  o.vocab_size = plan.data_needs().vocab_size;
  o.dp_rank = ctx.dp_rank();
  o.dp_size = dp;
  o.seed = static_cast<uint64_t>(t.seed);
  o.pad_id = eod.value_or(0);
  o.log = ctx.global_rank() == 0;
  o.pack = d.packing_sft_data;
  const auto needs = plan.data_needs();
  o.media = needs.media;
  o.image_token_id = needs.image_token_id;
  o.video_token_id = needs.video_token_id;
  o.patch_size = needs.patch_size;
  o.temporal_patch_size = needs.temporal_patch_size;
  o.merge_size = needs.merge_size;
  o.videos_why = needs.store_videos_why;
  if (d.use_vlm_dp_balance) {
    o.balance = true;
    o.balance_cost = d.vlm_dp_balance_cost;
    o.balance_warmup_iters = d.vlm_dp_balance_warmup_iters;
    o.global_batch = t.global_batch_size.value_or(t.micro_batch_size * dp);
    o.log_interval = job.logging.log_interval;
    o.group = ctx.world_size() > 1 ? &ctx.world() : nullptr;
    o.device = lf::backend::select_backend().device();
  }
  return make_sft_sources(o);
}

std::string split_string(const std::vector<double>& split) {
  std::ostringstream os;
  for (size_t i = 0; i < split.size(); ++i) os << (i ? "," : "") << split[i];
  return os.str();
}

}  // namespace

DataSources make_data_sources(const lf::config::JobConfig& job, const lf::models::ModelPlan& plan,
                              const lf::dist::ParallelContext& ctx, std::optional<int64_t> eod) {
  const auto& t = job.training;
  const int dp = ctx.dp_size();
  const int64_t global_batch = t.global_batch_size.value_or(t.micro_batch_size * dp);
  const auto needs = plan.data_needs();
  const int64_t train_samples = t.train_iters * global_batch;
  const int64_t valid_samples = t.eval_iters > 0 ? t.eval_iters * t.micro_batch_size * dp : 0;
  const uint64_t seed = static_cast<uint64_t>(t.seed);
  if (job.training.training_phase == "sft") return make_sft_sources_for(job, plan, ctx, eod);
  DataSources out;
  if (needs.latents && !job.data.mock_data) {
    LF_CHECK(!job.data.data_path.empty(), "no training data: data.data_path is empty",
             lf::hint("pass --data-path DIR (a latent store: loongforge-data diffusion) or --mock-data"));
    return make_latent_sources(job, needs, ctx, train_samples, valid_samples);
  }
  if (needs.vla && !job.data.mock_data) {
    LF_CHECK(!job.data.data_path.empty(), "no training data: data.data_path is empty",
             lf::hint("pass --data-path DIR (a reach demo store: loongforge-data make-demo-reach) or --mock-data"));
    return make_vla_sources(job, needs, ctx, train_samples, valid_samples);
  }
  if (!needs.token_data) {
    out.train = std::make_unique<SyntheticSource>(plan, train_samples, t.micro_batch_size, ctx.dp_rank(), dp, seed);
    // Held-out samples: drawn from another seed.
    if (valid_samples > 0)
      out.valid = std::make_unique<SyntheticSource>(plan, valid_samples, t.micro_batch_size, ctx.dp_rank(), dp,
                                                    seed + 7919);
    return out;
  }
  lf::data::GptDataOptions o;
  o.data_path = job.data.data_path;
  o.split = split_string(job.data.split);
  o.seq_length = t.seq_length;
  o.seed = seed;
  o.num_samples = {train_samples, valid_samples, 0};
  o.mock = job.data.mock_data;
  o.mock_vocab_size = needs.vocab_size;
  o.vocab_size = needs.vocab_size;
  if (job.data.data_cache_path) o.cache_dir = *job.data.data_cache_path;
  LF_CHECK(o.mock || !o.data_path.empty(), "no training data: data.data_path is empty",
           lf::hint("pass --data-path PREFIX (a Megatron .bin/.idx pair) or --mock-data"));
  auto splits = lf::data::build_gpt_datasets(o);
  LF_CHECK(splits.datasets[0] != nullptr, "the train split of ", o.split, " has no documents",
           lf::hint("give the train part of --split a positive weight"));
  if (!job.data.valid_data_path.empty() && o.num_samples[1] > 0) {
    // Megatron's --valid-data-path: the whole of these datasets is the validation split.
    lf::data::GptDataOptions v = o;
    v.data_path = job.data.valid_data_path;
    v.split = "0,1,0";
    v.num_samples = {0, o.num_samples[1], 0};
    v.mock = false;
    splits.datasets[1] = lf::data::build_gpt_datasets(v).datasets[1];
  }
  BatchOptions bo;
  bo.eod = eod;
  bo.eod_mask_loss = job.data.eod_mask_loss;
  bo.reset_position_ids = job.data.reset_position_ids;
  bo.reset_attention_mask = job.data.reset_attention_mask;
  bo.mock = job.data.mock_data;
  bo.seed = seed;
  bo.plan = &plan;
  const int workers = static_cast<int>(job.data.num_workers);
  out.train = std::make_unique<LoaderSource>(splits.datasets[0], t.micro_batch_size, ctx.dp_rank(), dp, workers, "train", bo);
  if (splits.datasets[1]) {
    BatchOptions vo = bo;
    vo.seed = seed + 7919;  // the held-out split's mock fields differ from the training split's
    out.valid = std::make_unique<LoaderSource>(splits.datasets[1], t.micro_batch_size, ctx.dp_rank(), dp, workers,
                                               "valid", vo);
  }
  return out;
}

}  // namespace lf::tools
