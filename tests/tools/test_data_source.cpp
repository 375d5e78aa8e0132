// The document fields of loongforge-train's batches (tools/train/data_source.h) against Megatron's
// get_ltor_masks_and_position_ids, written out as its loops: loss mask zero where the input is the
// end-of-document token, positions restarting after each one, attention only within a document.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <random>

#include "data_source.h"
#include "loongforge/backend/registry.h"
#include "loongforge/data/indexed_dataset.h"
#include "loongforge/models/blocks/attention.h"
#include "loongforge/models/composites/causal_lm.h"
#include "multiprocess.h"
#include "../models/tiny_decoder.h"

namespace {

TEST(DataSource, DocumentFieldsMatchMegatronsMasksAndPositions) {
  const int64_t eod = 9, b = 2, s = 10;
  auto tokens = at::tensor({1, 2, 9, 3, 4, 5, 9, 9, 6, 7, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9}, at::kLong).view({b, s});
  lf::data::Batch batch;
  batch.set("tokens", tokens, 1);
  batch.set("loss_mask", at::ones({b, s}, at::kFloat), 1);
  lf::tools::add_document_fields(batch, eod, true, true, true);
  // Megatron: loss_mask[data == eod] = 0; for each eod at i: attention_mask[b, 0, i+1:, :i+1] = 0
  // (on top of causal) and position_ids[b, i+1:] -= i + 1 - prev_index.
  auto loss_mask = at::ones({b, s}, at::kFloat);
  auto attention = at::ones({b, 1, s, s}, at::kBool).tril();
  auto positions = at::arange(s, at::kLong).repeat({b, 1});
  for (int64_t r = 0; r < b; ++r) {
    int64_t prev = 0;
    for (int64_t i = 0; i < s; ++i) {
      if (tokens[r][i].item<int64_t>() != eod) continue;
      loss_mask[r][i] = 0;
      attention[r][0].narrow(0, i + 1, s - i - 1).narrow(1, 0, i + 1).fill_(false);
      positions[r].narrow(0, i + 1, s - i - 1).sub_(i + 1 - prev);
      prev = i + 1;
    }
  }
  EXPECT_TRUE(at::equal(batch.at("loss_mask"), loss_mask));
  EXPECT_TRUE(at::equal(batch.at("position_ids"), positions)) << batch.at("position_ids");
  EXPECT_TRUE(at::equal(lf::models::block_causal_mask(batch.at("document_ids")), attention));
  EXPECT_EQ(batch.sequence_dim("document_ids"), 1);  // ChunkPipe would cut them with the tokens
  // Each flag adds only its own field.
  lf::data::Batch only;
  only.set("tokens", tokens, 1);
  lf::tools::add_document_fields(only, eod, false, true, false);
  EXPECT_TRUE(only.contains("position_ids"));
  EXPECT_FALSE(only.contains("document_ids"));
  EXPECT_FALSE(only.contains("loss_mask"));
}

TEST(DataSource, BatchesSliceTheirSequenceFields) {
  lf::data::Batch batch;
  batch.set("tokens", at::arange(12, at::kLong).view({2, 6}), 1);
  batch.set("features", at::ones({2, 3, 4}), -1);
  auto part = batch.slice_sequence(2, 3);
  EXPECT_TRUE(at::equal(part.at("tokens"), at::tensor({2, 3, 4, 8, 9, 10}, at::kLong).view({2, 3})));
  EXPECT_EQ(part.at("features").sizes(), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_THROW(batch.slice_sequence(4, 3), lf::Error);
  EXPECT_THROW(batch.at("labels"), lf::Error);
}

// An SFT store as `loongforge-data preprocess --conversations` writes it: per conversation its
// tokens and its answer mask (prompt 0, answer 1, several turns), lengths 6..29.
struct SftStore {
  std::string prefix;
  std::vector<std::vector<int32_t>> tokens, masks;
};

SftStore write_sft_store(const std::string& dir, int conversations, int64_t vocab) {
  SftStore st;
  st.prefix = dir + "/sft";
  lf::data::IndexedDatasetBuilder tb(st.prefix + "_input_ids_document", lf::data::TokenDType::u16, vocab),
      mb(st.prefix + "_assistant_masks_document", lf::data::TokenDType::u8, 2);
  std::mt19937 rng(7);
  for (int c = 0; c < conversations; ++c) {
    std::vector<int32_t> t, m;
    const int turns = 1 + c % 2;
    for (int k = 0; k < turns; ++k) {
      const int prompt = 3 + static_cast<int>(rng() % 6), answer = 1 + static_cast<int>(rng() % 8);
      for (int i = 0; i < prompt; ++i) t.push_back(static_cast<int32_t>(rng() % vocab)), m.push_back(0);
      for (int i = 0; i < answer; ++i) t.push_back(static_cast<int32_t>(rng() % vocab)), m.push_back(1);
    }
    const int32_t n = static_cast<int32_t>(t.size());
    tb.add_document(t, std::vector<int32_t>{n});
    mb.add_document(m, std::vector<int32_t>{n});
    st.tokens.push_back(t);
    st.masks.push_back(m);
  }
  tb.finalize();
  mb.finalize();
  return st;
}

lf::tools::SftOptions sft_options(const std::string& prefix, int64_t seq, int64_t micro, int64_t samples) {
  lf::tools::SftOptions o;
  o.prefix = prefix;
  o.seq_length = seq;
  o.micro_batch = micro;
  o.train_samples = samples;
  return o;
}

// Rows hold one conversation each: tokens[k] = c[k], labels[k] = c[k + 1] and loss_mask[k] = the
// answer mask of c[k + 1]; padding past the conversation (label -100, mask 0); long conversations
// cut at seq_length + 1 tokens; every conversation once per epoch.
TEST(SftSource, RowsAreConversationsWithTheirAnswerMasksShifted) {
  const std::string d = lf::testing::make_temp_dir("sft_source");
  const SftStore st = write_sft_store(d, 10, 50);
  lf::tools::SftOptions o = sft_options(st.prefix, 20, 2, 20);  // 10 conversations: two epochs
  o.vocab_size = 50;
  o.seed = 3;
  auto src = lf::tools::make_sft_sources(o);
  ASSERT_TRUE(src.train);
  EXPECT_FALSE(src.valid);
  std::vector<int> seen(10, 0);
  for (int step = 0; step < 10; ++step) {
    auto b = src.train->next();
    ASSERT_EQ(b.at("tokens").sizes(), (std::vector<int64_t>{2, 20}));
    for (int64_t r = 0; r < 2; ++r) {
      // Which conversation: the one whose first tokens match.
      int conv = -1;
      for (int c = 0; c < 10 && conv < 0; ++c) {
        bool same = true;
        for (int64_t k = 0; k + 1 < std::min<int64_t>(st.tokens[c].size(), 21); ++k)
          same = same && b.at("tokens")[r][k].item<int64_t>() == st.tokens[c][k];
        if (same) conv = c;
      }
      ASSERT_GE(conv, 0) << "row " << r << " of step " << step << " is no conversation of the store";
      ++seen[conv];
      const auto& t = st.tokens[conv];
      const auto& m = st.masks[conv];
      const int64_t n = std::min<int64_t>(t.size(), 21);
      for (int64_t k = 0; k < 20; ++k) {
        if (k + 1 < n) {
          EXPECT_EQ(b.at("labels")[r][k].item<int64_t>(), t[k + 1]);
          EXPECT_EQ(b.at("loss_mask")[r][k].item<float>(), static_cast<float>(m[k + 1])) << "conv " << conv << " k " << k;
        } else {
          EXPECT_EQ(b.at("labels")[r][k].item<int64_t>(), -100);
          EXPECT_EQ(b.at("loss_mask")[r][k].item<float>(), 0.0f);
        }
      }
    }
  }
  for (int c = 0; c < 10; ++c) EXPECT_EQ(seen[c], 2) << "conversation " << c;
  // A mask store of other lengths is refused, naming the conversation.
  lf::data::IndexedDatasetBuilder bad(d + "/bad_assistant_masks_document", lf::data::TokenDType::u8, 2);
  lf::data::IndexedDatasetBuilder good(d + "/bad_input_ids_document", lf::data::TokenDType::u16, 50);
  good.add_document(std::vector<int32_t>{1, 2, 3}, std::vector<int32_t>{3});
  bad.add_document(std::vector<int32_t>{0, 1}, std::vector<int32_t>{2});
  good.finalize();
  bad.finalize();
  o.prefix = d + "/bad";
  try {
    lf::tools::make_sft_sources(o);
    FAIL() << "a store with mismatched masks was accepted";
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("conversation 0 has 2 mask values"), std::string::npos) << e.what();
  }
}

// The loss counts answer tokens only: a prompt token's label can be anything, an answer token's
// changes the loss.
TEST(SftSource, OnlyAnswerLabelsReachTheLoss) {
  const std::string d = lf::testing::make_temp_dir("sft_loss");
  const SftStore st = write_sft_store(d, 6, 50);
  lf::tools::SftOptions o = sft_options(st.prefix, 16, 3, 3);
  auto batch = lf::tools::make_sft_sources(o).train->next();
  auto c = lf::testing::tiny_decoder_config();  // vocabulary 50, 16 positions
  lf::models::CausalLm model(c, lf::backend::cpu_backend(), 11, at::kFloat);
  model.set_training(false);
  auto loss = [&](const lf::data::Batch& b) {
    at::NoGradGuard g;
    auto out = model.forward_step(b, lf::models::Pass::train);
    return out.losses.at(0).sum.item<double>();
  };
  const double base = loss(batch);
  const at::Tensor mask = batch.at("loss_mask");
  int64_t prompt = -1, answer = -1;
  for (int64_t k = 0; k < 16; ++k) {
    if (batch.at("labels")[0][k].item<int64_t>() < 0) break;
    if (mask[0][k].item<float>() == 0 && prompt < 0) prompt = k;
    if (mask[0][k].item<float>() == 1 && answer < 0) answer = k;
  }
  ASSERT_GE(prompt, 0);
  ASSERT_GE(answer, 0);
  auto with_label = [&](int64_t k) {
    lf::data::Batch b = batch;
    at::Tensor labels = batch.at("labels").clone();
    labels[0][k] = (labels[0][k].item<int64_t>() + 17) % 50;
    b.set("labels", labels, 1);
    return b;
  };
  EXPECT_EQ(loss(with_label(prompt)), base) << "a prompt token's label changed the loss";
  EXPECT_NE(loss(with_label(answer)), base) << "an answer token's label did not change the loss";
  EXPECT_EQ(model.loss_counts(batch).at("lm loss"), mask.sum().item<double>());
}

// fn(row, a, b, cut) for each document run [a, b) of the packed rows (its positions must restart
// at 0); cut(field, fill) is that run of a field as a row of its own, padded with `fill`.
template <class Fn>
void for_each_document(const lf::data::Batch& packed, Fn&& fn) {
  const int64_t rows = packed.at("tokens").size(0), s = packed.at("tokens").size(1);
  for (int64_t r = 0; r < rows; ++r) {
    const at::Tensor doc = packed.at("document_ids")[r];
    for (int64_t a = 0; a < s;) {
      int64_t b = a;
      while (b < s && doc[b].item<int64_t>() == doc[a].item<int64_t>()) ++b;
      EXPECT_EQ(packed.at("position_ids")[r][a].item<int64_t>(), 0) << "row " << r << " at " << a;
      auto cut = [&](const char* f, double fill) {
        at::Tensor row = at::full({s}, fill, packed.at(f).options());
        row.narrow(0, 0, b - a).copy_(packed.at(f)[r].narrow(0, a, b - a));
        return row;
      };
      fn(r, a, b, cut);
      a = b;
    }
  }
}

// The loss and every gradient of a tiny decoder on `packed` rows equal those on the same documents
// each in its own row (tokens / labels / masks: one padded row per document), <= 1e-6 relative;
// the loss counts are the mask's.
void expect_packed_equals_separate(const lf::data::Batch& packed, const std::vector<at::Tensor>& tokens,
                                   const std::vector<at::Tensor>& labels, const std::vector<at::Tensor>& masks) {
  lf::data::Batch separate;
  separate.set("tokens", at::stack(tokens), 1);
  separate.set("labels", at::stack(labels), 1);
  separate.set("loss_mask", at::stack(masks), 1);
  auto c = lf::testing::tiny_decoder_config();  // vocabulary 50
  c.max_position_embeddings = 64;
  auto run = [&](const lf::data::Batch& b) {
    lf::models::CausalLm m(c, lf::backend::cpu_backend(), 21, at::kFloat);
    auto out = m.forward_step(b, lf::models::Pass::train);
    out.losses.at(0).sum.backward();
    std::vector<at::Tensor> r{out.losses.at(0).sum.detach()};
    for (const auto& p : m.parameters()) r.push_back(p.tensor.grad());
    EXPECT_EQ(m.loss_counts(b).at("lm loss"), b.at("loss_mask").sum().item<double>());
    return r;
  };
  const auto want = run(separate), got = run(packed);
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const double scale = want[i].abs().max().item<double>();
    EXPECT_LE((got[i] - want[i]).abs().max().item<double>(), 1e-6 * scale + 1e-9) << "tensor " << i;
  }
}

// --packing-sft-data: a row holds whole conversations (positions restarting, one document id
// each, the padding a document of its own); its loss and every gradient equal those of the same
// conversations each in its own row (attention per document, no [s, s] mask), <= 1e-6 relative.
TEST(SftSource, PackedRowsEqualEachConversationInItsOwnRow) {
  const std::string d = lf::testing::make_temp_dir("sft_pack");
  const SftStore st = write_sft_store(d, 12, 50);
  lf::tools::SftOptions o = sft_options(st.prefix, 48, 2, 4);
  o.pack = true;
  auto packed = lf::tools::make_sft_sources(o).train->next();
  ASSERT_TRUE(packed.contains("document_ids") && packed.contains("position_ids"));
  // Each document of the packed rows as a row of its own.
  std::vector<at::Tensor> tokens, labels, masks;
  int64_t documents = 0;
  for_each_document(packed, [&](int64_t r, int64_t a, int64_t b, const auto& cut) {
    if (packed.at("labels")[r].narrow(0, a, b - a).ge(0).any().item<bool>()) {
      // A whole conversation of the store: its tokens, then its last token as the final label.
      bool whole = false;
      for (const auto& conv : st.tokens)
        if (static_cast<int64_t>(conv.size()) == b - a + 1) {
          bool same = true;
          for (int64_t k = 0; k < b - a; ++k) same = same && packed.at("tokens")[r][a + k].item<int64_t>() == conv[k];
          whole = whole || same;
        }
      EXPECT_TRUE(whole) << "row " << r << " [" << a << ", " << b << ") is not a whole conversation";
      tokens.push_back(cut("tokens", 0));
      labels.push_back(cut("labels", -100));
      masks.push_back(cut("loss_mask", 0));
      ++documents;
    }
  });
  EXPECT_GT(documents, 2) << "nothing was packed";
  expect_packed_equals_separate(packed, tokens, labels, masks);
}

// Pretraining rows with --reset-position-ids --reset-attention-mask --eod-mask-loss (Megatron's
// semantics: an end-of-document token closes its document, positions restart after it, the
// prediction from it -- the next document's first token -- is masked): the loss and every
// gradient of packed rows equal those of each document in its own row, <= 1e-6 relative.
TEST(PretrainingRows, PackedDocumentsEqualEachDocumentInItsOwnRow) {
  const int64_t s = 40, eod = 0;
  at::manual_seed(5);
  at::Tensor stream = at::randint(1, 50, {2, s + 1}, at::kLong);
  for (int64_t k : {6, 7, 19, 33}) stream[0][k] = eod;  // uneven documents, one of a single token
  for (int64_t k : {12, 25}) stream[1][k] = eod;
  lf::data::Batch packed;
  packed.set("tokens", stream.narrow(1, 0, s).contiguous(), 1);
  packed.set("labels", stream.narrow(1, 1, s).contiguous(), 1);
  packed.set("loss_mask", at::ones({2, s}, at::kFloat), 1);
  lf::tools::add_document_fields(packed, eod, true, true, true);
  std::vector<at::Tensor> tokens, labels, masks;
  for_each_document(packed, [&](int64_t, int64_t, int64_t, const auto& cut) {
    tokens.push_back(cut("tokens", 1));
    labels.push_back(cut("labels", -100));
    masks.push_back(cut("loss_mask", 0));
  });
  ASSERT_EQ(tokens.size(), 8u);  // 5 documents in row 0, 3 in row 1
  EXPECT_EQ(packed.at("loss_mask").sum().item<double>(), 2 * s - 6);  // the 6 end-of-document tokens
  expect_packed_equals_separate(packed, tokens, labels, masks);
}

}  // namespace
