// The document fields of loongforge-train's batches (tools/train/data_source.h) against Megatron's
// get_ltor_masks_and_position_ids, written out as its loops: loss mask zero where the input is the
// end-of-document token, positions restarting after each one, attention only within a document.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "data_source.h"
#include "loongforge/models/blocks/attention.h"

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

}  // namespace
