// Fuzzes the two readers of untrusted binary files under AddressSanitizer + UBSan: the
// safetensors Reader (core/safetensors.h, from_bytes) and the Megatron .idx reader
// (data/indexed_dataset.h, through files in a temp dir). Seeded mutations of valid inputs (byte
// flips, truncation, extension, header-length and JSON-number edits); every input must either
// parse (and then every byte it points at is read, so ASan sees any out-of-range view) or throw
// lf::Error. Anything else (another exception type, a sanitizer report, a crash) fails.
// Built from the reader sources directly with the sanitizer flags (tests/fuzz/CMakeLists.txt).
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "loongforge/core/error.h"
#include "loongforge/core/safetensors.h"
#include "loongforge/data/indexed_dataset.h"

namespace {
namespace fs = std::filesystem;

int failures = 0;

void fail(const std::string& what, int i, const std::string& msg) {
  if (++failures <= 10) std::fprintf(stderr, "FAIL %s case %d: %s\n", what.c_str(), i, msg.c_str());
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// One mutation of `s`, chosen by rng. Structure-aware edits target the 8-byte header length and
// the numbers in the JSON header, where the interesting checks are.
std::string mutate(std::string s, std::mt19937_64& rng, size_t header_end) {
  header_end = std::min(header_end, s.size());
  auto pick = [&](uint64_t n) { return n == 0 ? 0 : static_cast<size_t>(rng() % n); };
  const int kind = static_cast<int>(rng() % 9);
  switch (kind) {
    case 0:  // flip random bytes
      for (int k = 0, n = 1 + static_cast<int>(rng() % 4); k < n && !s.empty(); ++k) s[pick(s.size())] ^= static_cast<char>(1 << (rng() % 8));
      break;
    case 1:  // truncate
      s.resize(pick(s.size() + 1));
      break;
    case 2:  // extend with junk
      for (int k = 0, n = 1 + static_cast<int>(rng() % 64); k < n; ++k) s.push_back(static_cast<char>(rng()));
      break;
    case 3: {  // overwrite an 8-byte little-endian integer at the start or anywhere in the header
      const uint64_t values[] = {0, 1, 7, 8, 0xffffffffull, 0x7fffffffffffffffull, ~0ull, s.size(), s.size() + 1, rng()};
      const uint64_t v = values[pick(10)];
      const size_t at = rng() % 2 ? 0 : pick(std::min(s.size(), header_end));
      for (int b = 0; b < 8 && at + b < s.size(); ++b) s[at + b] = static_cast<char>((v >> (8 * b)) & 0xff);
      break;
    }
    case 4: {  // replace a digit run in the header with an extreme number
      const char* nums[] = {"0", "-1", "18446744073709551615", "18446744073709551616", "9223372036854775807",
                            "4294967296", "1e300", "3.5", "99999999999999999999999"};
      size_t at = 8 + pick(header_end > 8 ? header_end - 8 : 1);
      while (at < header_end && !(s[at] >= '0' && s[at] <= '9')) ++at;
      size_t end = at;
      while (end < header_end && s[end] >= '0' && s[end] <= '9') ++end;
      if (at < header_end) s.replace(at, end - at, nums[pick(9)]);
      break;
    }
    case 5:  // delete a range
      if (!s.empty()) {
        const size_t at = pick(s.size());
        s.erase(at, pick(s.size() - at + 1));
      }
      break;
    case 6: {  // duplicate a range
      if (!s.empty()) {
        const size_t at = pick(s.size()), n = pick(std::min<size_t>(64, s.size() - at) + 1);
        s.insert(at, s.substr(at, n));
      }
      break;
    }
    case 7: {  // swap structural JSON characters in the header
      const char tokens[] = {'{', '}', '[', ']', '"', ':', ',', '\0', '\\'};
      for (int k = 0, n = 1 + static_cast<int>(rng() % 3); k < n && header_end > 8; ++k)
        s[8 + pick(header_end - 8)] = tokens[pick(9)];
      break;
    }
    default:  // several of the above
      s = mutate(mutate(std::move(s), rng, header_end), rng, header_end);
  }
  return s;
}

// Valid safetensors files to start from.
std::vector<std::string> safetensors_seeds(const std::string& dir) {
  std::vector<std::string> out;
  std::vector<float> f(24);
  std::vector<uint16_t> h(10);
  std::vector<int64_t> l(3, 7);
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i) * 0.5f;
  for (int variant = 0; variant < 3; ++variant) {
    lf::safetensors::Writer w;
    w.add("a.weight", lf::safetensors::DType::F32, {4, 6}, f.data());
    if (variant > 0) w.add("b", lf::safetensors::DType::BF16, {10}, h.data());
    if (variant > 1) {
      w.add("c.empty", lf::safetensors::DType::I64, {0, 3}, l.data());
      w.add("d", lf::safetensors::DType::I64, {3}, l.data());
      w.set_metadata("format", "pt");
    }
    const std::string path = dir + "/seed" + std::to_string(variant) + ".safetensors";
    w.write(path);
    out.push_back(read_all(path));
  }
  return out;
}

void fuzz_safetensors(const std::string& dir, int cases, uint64_t seed) {
  auto seeds = safetensors_seeds(dir);
  std::mt19937_64 rng(seed);
  int parsed = 0;
  for (int i = 0; i < cases; ++i) {
    const std::string& base = seeds[rng() % seeds.size()];
    uint64_t hl = 0;
    for (int b = 7; b >= 0; --b) hl = (hl << 8) | static_cast<unsigned char>(base[static_cast<size_t>(b)]);
    const std::string bytes = mutate(base, rng, 8 + static_cast<size_t>(hl));
    try {
      auto r = lf::safetensors::Reader::from_bytes(bytes, "fuzz");
      unsigned sum = 0;
      for (const auto& t : r.tensors()) {
        const unsigned char* p = r.data(t);
        for (uint64_t k = 0; k < t.end - t.begin; ++k) sum += p[k];
      }
      for (const auto& [k, v] : r.metadata()) sum += static_cast<unsigned>(k.size() + v.size());
      (void)sum;
      ++parsed;
    } catch (const lf::Error&) {
    } catch (const std::exception& e) {
      fail("safetensors", i, std::string("non-lf::Error exception: ") + e.what());
    }
  }
  std::printf("safetensors: %d cases, %d parsed, %d rejected with lf::Error\n", cases, parsed, cases - parsed - failures);
}

void fuzz_idx(const std::string& dir, int cases, uint64_t seed) {
  const std::string good = dir + "/good";
  {
    lf::data::IndexedDatasetBuilder b(good, lf::data::TokenDType::u16);
    std::vector<int32_t> doc1 = {1, 2, 3, 4, 5}, doc2 = {6, 7}, lens = {3, 2};
    b.add_document(doc1, lens);
    b.add_sequence(doc2);
    b.end_document();
    b.finalize();
  }
  const std::string idx = read_all(good + ".idx"), bin = read_all(good + ".bin");
  std::mt19937_64 rng(seed);
  int parsed = 0, failed_before = failures;
  const std::string prefix = dir + "/case";
  for (int i = 0; i < cases; ++i) {
    write_all(prefix + ".idx", mutate(idx, rng, idx.size()));
    std::string b = bin;
    if (rng() % 4 == 0) b = mutate(b, rng, 0);
    write_all(prefix + ".bin", b);
    try {
      lf::data::IndexedDataset ds(prefix);
      std::vector<int64_t> out;
      for (int64_t s = 0; s < ds.num_sequences(); ++s) {
        const int64_t n = ds.sequence_length(s);
        out.resize(static_cast<size_t>(n));
        ds.read(s, 0, n, out.data());
      }
      for (int64_t d = 0; d <= ds.num_documents(); ++d) (void)ds.document_index(d);
      ++parsed;
    } catch (const lf::Error&) {
    } catch (const std::exception& e) {
      fail("idx", i, std::string("non-lf::Error exception: ") + e.what());
    }
  }
  std::printf(".idx: %d cases, %d parsed, %d rejected with lf::Error\n", cases, parsed,
              cases - parsed - (failures - failed_before));
}

}  // namespace

int main(int argc, char** argv) {
  const int cases = argc > 1 ? std::atoi(argv[1]) : 4000;
  const std::string dir = (fs::temp_directory_path() / ("lf-fuzz-" + std::to_string(::getpid()))).string();
  fs::create_directories(dir);
  fuzz_safetensors(dir, cases, 0x5afe7e45);
  fuzz_idx(dir, cases / 2, 0x1d8c0de);
  fs::remove_all(dir);
  if (failures) {
    std::fprintf(stderr, "%d failure(s)\n", failures);
    return 1;
  }
  std::printf("no crash, every input parsed or was an lf::Error\n");
  return 0;
}
