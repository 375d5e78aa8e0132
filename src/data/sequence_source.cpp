// SequenceSource helpers and the synthetic MockSequences used by --mock-data.
#include "loongforge/data/sequence_source.h"

#include <random>

#include "loongforge/core/error.h"

namespace lf::data {

std::vector<int64_t> SequenceSource::get(int64_t i, int64_t offset, int64_t count) const {
  if (count < 0) count = sequence_length(i) - offset;
  std::vector<int64_t> out(static_cast<size_t>(count));
  read(i, offset, count, out.data());
  return out;
}

MockSequences::MockSequences(int64_t num_sequences, int64_t max_length, int64_t vocab_size,
                             int64_t eod, uint64_t seed)
    : max_length_(max_length), vocab_size_(vocab_size), eod_(eod), seed_(seed) {
  LF_CHECK(num_sequences > 0 && max_length > 0, "mock data needs sequences and a length, got ",
           num_sequences, " sequences of at most ", max_length, " tokens");
  LF_CHECK(vocab_size >= 2 && eod >= 0 && eod < vocab_size, "mock data: vocab_size ", vocab_size,
           " and eod ", eod, " must satisfy 0 <= eod < vocab_size, vocab_size >= 2");
  std::mt19937_64 rng(seed);
  lengths_.resize(static_cast<size_t>(num_sequences));
  for (auto& l : lengths_) l = static_cast<int32_t>(1 + rng() % static_cast<uint64_t>(max_length));
}

int64_t MockSequences::sequence_length(int64_t i) const {
  LF_CHECK(i >= 0 && i < num_sequences(), "mock sequence ", i, " out of range [0, ",
           num_sequences(), ")");
  return lengths_[static_cast<size_t>(i)];
}

void MockSequences::read(int64_t i, int64_t offset, int64_t count, int64_t* out) const {
  int64_t len = sequence_length(i);
  LF_CHECK(offset >= 0 && count >= 0 && offset + count <= len, "mock sequence ", i, " has ", len,
           " tokens; asked for [", offset, ", ", offset + count, ")");
  for (int64_t j = offset; j < offset + count; ++j)
    *out++ = j == len - 1 ? eod_ : 1 + (i * 131 + j) % (vocab_size_ - 1);
}

std::string MockSequences::id() const {
  return lf::str("mock(n=", num_sequences(), ",max_len=", max_length_, ",vocab=", vocab_size_,
                 ",eod=", eod_, ",seed=", seed_, ")");
}

}  // namespace lf::data
