// Indexed dataset tests: a .idx/.bin pair assembled byte by byte from Megatron's published
// layout (not with our writer) is read correctly, our writer reproduces it byte for byte, and
// damaged files are errors that name the file.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "loongforge/core/error.h"
#include "loongforge/data/indexed_dataset.h"
#include "multiprocess.h"

namespace {

using lf::data::IndexedDataset;
using lf::data::IndexedDatasetBuilder;
using lf::data::TokenDType;

// Little-endian byte assembly, independent of the library.
struct Bytes {
  std::string s;
  Bytes& raw(const char* p, size_t n) { s.append(p, n); return *this; }
  template <class T>
  Bytes& le(T v, int n = sizeof(T)) {
    uint64_t u = static_cast<uint64_t>(v);
    for (int k = 0; k < n; ++k) s.push_back(static_cast<char>((u >> (8 * k)) & 0xFF));
    return *this;
  }
};

// Three documents: doc 0 = sequences {5, 6, 7} and {1}; doc 1 = {65535, 0}; doc 2 = {42, 3, 9}.
const std::vector<std::vector<int>> kSeqs = {{5, 6, 7}, {1}, {65535, 0}, {42, 3, 9}};

// The published format: magic, u64 version 1, u8 dtype code, u64 S, u64 D, i32 lengths[S],
// i64 byte pointers[S], i64 document indices[D] (0, then one past each document's last
// sequence); .bin is the tokens back to back.
void write_spec_pair(const std::string& prefix, uint8_t code, int token_bytes) {
  Bytes idx, bin;
  idx.raw("MMIDIDX\x00\x00", 9).le<uint64_t>(1).le<uint8_t>(code).le<uint64_t>(4).le<uint64_t>(4);
  for (const auto& s : kSeqs) idx.le<int32_t>(static_cast<int32_t>(s.size()));
  int64_t ptr = 0;
  for (const auto& s : kSeqs) idx.le<int64_t>(ptr), ptr += static_cast<int64_t>(s.size()) * token_bytes;
  for (int64_t d : {0, 2, 3, 4}) idx.le<int64_t>(d);
  for (const auto& s : kSeqs)
    for (int t : s) bin.le<int64_t>(t, token_bytes);
  std::ofstream(prefix + ".idx", std::ios::binary) << idx.s;
  std::ofstream(prefix + ".bin", std::ios::binary) << bin.s;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_our_pair(const std::string& prefix, TokenDType dtype) {
  IndexedDatasetBuilder b(prefix, dtype, 65536);
  std::vector<int32_t> doc0{5, 6, 7, 1}, lens0{3, 1};
  b.add_document(doc0, lens0);
  std::vector<int32_t> s2{65535, 0};
  b.add_sequence(s2);
  b.end_document();
  std::vector<int32_t> s3{42, 3, 9};
  b.add_sequence(s3);
  b.end_document();
  b.finalize();
}

TEST(IndexedDataset, ReadsAPairBuiltFromThePublishedFormat) {
  std::string dir = lf::testing::make_temp_dir("idx_spec");
  for (auto [code, width] : {std::pair<uint8_t, int>{8, 2}, {4, 4}}) {
    std::string prefix = dir + "/spec" + std::to_string(code);
    write_spec_pair(prefix, code, width);
    IndexedDataset ds(prefix);
    EXPECT_EQ(static_cast<int>(ds.dtype()), code);
    EXPECT_EQ(ds.num_sequences(), 4);
    EXPECT_EQ(ds.num_documents(), 3);
    EXPECT_EQ(ds.total_tokens(), 9);
    EXPECT_EQ(ds.sequence_pointer(3), 6 * width);
    EXPECT_EQ(ds.document_index(1), 2);
    for (size_t i = 0; i < kSeqs.size(); ++i) {
      auto got = ds.get(static_cast<int64_t>(i));
      EXPECT_EQ(got, std::vector<int64_t>(kSeqs[i].begin(), kSeqs[i].end())) << "sequence " << i;
    }
    EXPECT_EQ(ds.get(3, 1, 2), (std::vector<int64_t>{3, 9}));
  }
}

TEST(IndexedDataset, WriterOutputMatchesThePublishedFormatByteForByte) {
  std::string dir = lf::testing::make_temp_dir("idx_writer");
  write_spec_pair(dir + "/spec", 8, 2);
  write_our_pair(dir + "/ours", TokenDType::u16);
  EXPECT_EQ(slurp(dir + "/ours.idx"), slurp(dir + "/spec.idx"));
  EXPECT_EQ(slurp(dir + "/ours.bin"), slurp(dir + "/spec.bin"));
  EXPECT_EQ(slurp(dir + "/ours.idx").size(), 34u + 12 * 4 + 8 * 4);
  write_spec_pair(dir + "/spec32", 4, 4);
  write_our_pair(dir + "/ours32", TokenDType::i32);
  EXPECT_EQ(slurp(dir + "/ours32.idx"), slurp(dir + "/spec32.idx"));
  EXPECT_EQ(slurp(dir + "/ours32.bin"), slurp(dir + "/spec32.bin"));
}

TEST(IndexedDataset, DtypeFollowsTheVocabulary) {
  EXPECT_EQ(lf::data::optimal_dtype(257), TokenDType::u16);
  EXPECT_EQ(lf::data::optimal_dtype(65499), TokenDType::u16);
  EXPECT_EQ(lf::data::optimal_dtype(65500), TokenDType::i32);
  EXPECT_EQ(lf::data::optimal_dtype(151936), TokenDType::i32);
}

TEST(IndexedDataset, AddIndexConcatenatesDatasets) {
  std::string dir = lf::testing::make_temp_dir("idx_merge");
  write_our_pair(dir + "/a", TokenDType::u16);
  IndexedDatasetBuilder b(dir + "/ab", TokenDType::u16);
  b.add_index(dir + "/a");
  b.add_index(dir + "/a");
  b.finalize();
  IndexedDataset ab(dir + "/ab");
  EXPECT_EQ(ab.num_sequences(), 8);
  EXPECT_EQ(ab.num_documents(), 6);
  EXPECT_EQ(ab.document_index(4), 6);
  EXPECT_EQ(ab.sequence_pointer(5), 2 * 9 + 2 * 3);  // 9 tokens of a, then its first sequence
  EXPECT_EQ(ab.get(6), (std::vector<int64_t>{65535, 0}));
}

// Writes a damaged copy of the spec pair and expects an error naming `file` and containing `what`.
void expect_damage_error(const std::string& name, const std::function<void(std::string&, std::string&)>& damage,
                         const std::string& file_suffix, const std::string& what) {
  std::string dir = lf::testing::make_temp_dir("idx_bad_" + name);
  write_spec_pair(dir + "/p", 8, 2);
  std::string idx = slurp(dir + "/p.idx"), bin = slurp(dir + "/p.bin");
  damage(idx, bin);
  std::ofstream(dir + "/p.idx", std::ios::binary | std::ios::trunc) << idx;
  std::ofstream(dir + "/p.bin", std::ios::binary | std::ios::trunc) << bin;
  try {
    IndexedDataset ds(dir + "/p");
    FAIL() << name << ": expected an error";
  } catch (const lf::Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(dir + "/p" + file_suffix), std::string::npos) << name << ": " << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << name << ": " << msg;
  }
}

TEST(IndexedDataset, DamagedFilesAreErrorsNamingTheFile) {
  expect_damage_error("magic", [](std::string& i, std::string&) { i[0] = 'X'; }, ".idx", "bad magic");
  expect_damage_error("version", [](std::string& i, std::string&) { i[9] = 2; }, ".idx",
                      "index version 2, expected 1");
  expect_damage_error("dtype", [](std::string& i, std::string&) { i[17] = 9; }, ".idx",
                      "unknown dtype code 9");
  expect_damage_error("truncated_idx", [](std::string& i, std::string&) { i.resize(i.size() - 8); },
                      ".idx", "size 106 bytes");
  expect_damage_error("truncated_bin", [](std::string&, std::string& b) { b.resize(b.size() - 2); },
                      ".bin", "sequence 3 (3 tokens at byte 12) lies outside the 16-byte file");
  expect_damage_error("pointer", [](std::string& i, std::string&) {
    int64_t p = 1000;
    std::memcpy(&i[34 + 16 + 8], &p, 8);  // pointer of sequence 1
  }, ".bin", "sequence 1 (1 tokens at byte 1000)");
  expect_damage_error("doc_indices", [](std::string& i, std::string&) {
    int64_t d = 3;
    std::memcpy(&i[34 + 48 + 24], &d, 8);  // last document entry must equal S = 4
  }, ".idx", "document_indices must start at 0 and end at the sequence count 4");
}

TEST(IndexedDataset, TokenIdsAtOrAboveTheVocabularyAreErrors) {
  std::string dir = lf::testing::make_temp_dir("idx_vocab");
  write_spec_pair(dir + "/p", 8, 2);
  IndexedDataset ds(dir + "/p");
  EXPECT_NO_THROW(ds.validate_tokens(65536));
  try {
    ds.validate_tokens(1000);
    FAIL();
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir + "/p.bin: token id 65535 at sequence 2 position 0"),
              std::string::npos) << e.what();
  }
  IndexedDatasetBuilder b(dir + "/w", TokenDType::u16, 100);
  std::vector<int32_t> ok{1, 99}, bad{1, 100};
  b.add_sequence(ok);
  EXPECT_THROW(b.add_sequence(bad), lf::Error);
  IndexedDatasetBuilder b8(dir + "/w8", TokenDType::u8);
  std::vector<int32_t> big{256};
  EXPECT_THROW(b8.add_sequence(big), lf::Error);
}

TEST(IndexedDataset, MissingFilesNameThePath) {
  try {
    IndexedDataset ds("/nonexistent/dir/prefix");
    FAIL();
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/prefix.idx"), std::string::npos);
  }
}

}  // namespace
