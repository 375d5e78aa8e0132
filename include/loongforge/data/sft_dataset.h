// SftDataset: the conversations `loongforge-data preprocess --conversations` wrote, read back as
// (tokens, assistant mask) per conversation: <prefix>_input_ids_document and
// <prefix>_assistant_masks_document, validated to hold the same number of conversations of the
// same lengths. Not a batcher or packer: the trainer pads or packs what it reads here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lf::data {

class IndexedDataset;

class SftDataset {
 public:
  // prefix: the --output-prefix given to preprocess --conversations. Throws lf::Error naming the
  // file when either dataset is missing or malformed, when their conversation counts or lengths
  // differ, or when a mask holds a value other than 0 or 1.
  explicit SftDataset(const std::string& prefix);
  ~SftDataset();

  int64_t size() const;             // conversations
  int64_t length(int64_t i) const;  // tokens of conversation i
  // Conversation i's token ids and its mask (1 = answer token, trained on); both resized to
  // length(i). Thread-safe.
  void read(int64_t i, std::vector<int32_t>& tokens, std::vector<uint8_t>& mask) const;

  static std::string tokens_prefix(const std::string& prefix);  // <prefix>_input_ids_document
  static std::string masks_prefix(const std::string& prefix);   // <prefix>_assistant_masks_document

 private:
  std::unique_ptr<IndexedDataset> tokens_, masks_;
};

}  // namespace lf::data
