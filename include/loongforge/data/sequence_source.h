// SequenceSource: what GPT sampling reads tokens from, a list of token sequences addressed by
// index. Implemented by IndexedDataset (files) and MockSequences (synthetic, --mock-data).
// Not a sample dataset: samples of seq_length+1 tokens are built on top (gpt_dataset.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lf::data {

class SequenceSource {
 public:
  virtual ~SequenceSource() = default;
  virtual int64_t num_sequences() const = 0;
  virtual int64_t sequence_length(int64_t i) const = 0;
  // Writes tokens [offset, offset+count) of sequence i to out (count values). Thread-safe.
  virtual void read(int64_t i, int64_t offset, int64_t count, int64_t* out) const = 0;
  // Identifies the data in cache descriptions and messages (a path prefix, or "mock(...)").
  virtual std::string id() const = 0;

  std::vector<int64_t> get(int64_t i, int64_t offset = 0, int64_t count = -1) const;
};

// Deterministic synthetic sequences for --mock-data: lengths drawn from mt19937_64(seed) in
// [1, max_length]; sequence i holds tokens 1 + (i*131 + j) % (vocab_size-1) for j < len-1, then
// eod. Needs no files; every value is a function of (seed, i, j).
class MockSequences final : public SequenceSource {
 public:
  MockSequences(int64_t num_sequences, int64_t max_length, int64_t vocab_size, int64_t eod,
                uint64_t seed);
  int64_t num_sequences() const override { return static_cast<int64_t>(lengths_.size()); }
  int64_t sequence_length(int64_t i) const override;
  void read(int64_t i, int64_t offset, int64_t count, int64_t* out) const override;
  std::string id() const override;

 private:
  std::vector<int32_t> lengths_;
  int64_t max_length_, vocab_size_, eod_;
  uint64_t seed_;
};

}  // namespace lf::data
