// SftDataset: two indexed datasets read in step, checked against each other when opened.
#include "loongforge/data/sft_dataset.h"

#include "loongforge/core/error.h"
#include "loongforge/data/indexed_dataset.h"
#include "loongforge/data/preprocess.h"

namespace lf::data {

std::string SftDataset::tokens_prefix(const std::string& prefix) {
  return preprocess_output_prefix(prefix, "input_ids");
}
std::string SftDataset::masks_prefix(const std::string& prefix) {
  return preprocess_output_prefix(prefix, "assistant_masks");
}

SftDataset::SftDataset(const std::string& prefix)
    : tokens_(std::make_unique<IndexedDataset>(tokens_prefix(prefix))),
      masks_(std::make_unique<IndexedDataset>(masks_prefix(prefix))) {
  const std::string hint_text = "both files come from one `loongforge-data preprocess --conversations` run; rerun it";
  LF_CHECK(masks_->dtype() == TokenDType::u8, idx_path(masks_->prefix()), " holds ", dtype_name(masks_->dtype()),
           ", not uint8 assistant masks", lf::hint(hint_text));
  LF_CHECK(tokens_->num_sequences() == masks_->num_sequences(), idx_path(masks_->prefix()), " holds ",
           masks_->num_sequences(), " conversations but ", idx_path(tokens_->prefix()), " holds ",
           tokens_->num_sequences(), lf::hint(hint_text));
  for (int64_t i = 0; i < tokens_->num_sequences(); ++i)
    LF_CHECK(tokens_->sequence_length(i) == masks_->sequence_length(i), idx_path(masks_->prefix()),
             ": conversation ", i, " has ", masks_->sequence_length(i), " mask values but ",
             idx_path(tokens_->prefix()), " has ", tokens_->sequence_length(i), " tokens", lf::hint(hint_text));
  masks_->validate_tokens(2);
}

SftDataset::~SftDataset() = default;

int64_t SftDataset::size() const { return tokens_->num_sequences(); }

int64_t SftDataset::length(int64_t i) const {
  LF_CHECK(i >= 0 && i < size(), tokens_->prefix(), ": conversation ", i, " out of range [0, ", size(), ")");
  return tokens_->sequence_length(i);
}

void SftDataset::read(int64_t i, std::vector<int32_t>& tokens, std::vector<uint8_t>& mask) const {
  int64_t len = length(i);
  std::vector<int64_t> buf(static_cast<size_t>(len));
  tokens_->read(i, 0, len, buf.data());
  tokens.assign(buf.begin(), buf.end());
  masks_->read(i, 0, len, buf.data());
  mask.assign(buf.begin(), buf.end());
}

}  // namespace lf::data
