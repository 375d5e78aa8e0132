// core/safetensors: round trip, and each malformed header is an error naming the file and the
// tensor (never a crash). The ASan fuzz test (tests/fuzz) drives the same reader with random bytes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "loongforge/core/error.h"
#include "loongforge/core/safetensors.h"

namespace st = lf::safetensors;

namespace {
std::string with_header(const std::string& json, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json + data;
}

std::string error_of(const std::string& bytes) {
  try {
    st::Reader::from_bytes(bytes, "bad.safetensors");
  } catch (const lf::Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Safetensors, RoundTripKeepsOrderDtypesShapesAndMetadata) {
  const float a[6] = {1, 2, 3, 4, 5, 6};
  const int64_t b[2] = {-7, 1LL << 40};
  const uint16_t c[3] = {0x3f80, 0x4000, 0xbf80};  // bf16 1, 2, -1
  st::Writer w;
  w.add("z.first", st::DType::F32, {2, 3}, a);
  w.add("a.second", st::DType::I64, {2}, b);
  w.add("m.bf16", st::DType::BF16, {3}, c);
  w.add("empty", st::DType::F32, {0, 4}, nullptr);
  w.set_metadata("format", "pt");
  EXPECT_EQ(w.header().size() % 8, 0u);
  char tmpl[] = "/tmp/lf_st_XXXXXX";
  const int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  close(fd);
  const uint64_t written = w.write(tmpl, /*fsync=*/true);
  auto r = st::Reader::open(tmpl);
  EXPECT_EQ(written, 8 + w.header().size() + sizeof(a) + sizeof(b) + sizeof(c));
  ASSERT_EQ(r.tensors().size(), 4u);
  EXPECT_EQ(r.tensors()[0].name, "z.first");  // data order = insertion order
  EXPECT_EQ(r.metadata().at("format"), "pt");
  const auto& ta = r.at("z.first");
  EXPECT_EQ(ta.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(r.data(ta), a, sizeof(a)), 0);
  EXPECT_EQ(std::memcmp(r.data(r.at("a.second")), b, sizeof(b)), 0);
  EXPECT_EQ(r.at("m.bf16").dtype, st::DType::BF16);
  EXPECT_EQ(std::memcmp(r.data(r.at("m.bf16")), c, sizeof(c)), 0);
  EXPECT_EQ(r.at("empty").numel(), 0);
  EXPECT_EQ(r.find("nope"), nullptr);
  try {
    r.at("nope");
    FAIL();
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no tensor 'nope'"), std::string::npos) << e.what();
  }
  unlink(tmpl);
}

TEST(Safetensors, MalformedInputsNameTheProblem) {
  const std::string ok = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_EQ(error_of(with_header(ok, std::string(8, '\0'))), "");
  struct Case {
    std::string bytes, expect;
  };
  const std::vector<Case> cases = {
      {"abc", "shorter than the 8-byte header length"},
      {with_header(ok, "").substr(0, 20), "runs past the end of the file"},
      {with_header("{\"t\":", ""), "does not parse"},
      {with_header("[1,2]", ""), "not an object"},
      {with_header(R"({"t":{"shape":[2],"data_offsets":[0,8]}})", std::string(8, 0)), "'t' has no dtype"},
      {with_header(R"({"t":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", std::string(8, 0)),
       "unsupported dtype 'F33'"},
      {with_header(R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", std::string(8, 0)),
       "not a non-negative integer"},
      {with_header(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", std::string(8, 0)),
       "outside the 8-byte data section"},
      {with_header(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, 0)),
       "has 8 bytes for shape [3] of F32 (needs 12)"},
      {with_header(R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})",
                   std::string(8, 0)),
       "too large to address"},
      {with_header(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", std::string(8, 0)),
       "outside"},
      {with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                   std::string(8, 0)),
       "overlap"},
      {with_header(R"({"__metadata__":{"k":1}})", ""), "__metadata__ value of 'k' is not a string"},
  };
  for (const auto& c : cases) {
    const std::string err = error_of(c.bytes);
    EXPECT_NE(err.find(c.expect), std::string::npos) << "expected '" << c.expect << "', got: " << err;
    if (!err.empty()) EXPECT_NE(err.find("bad.safetensors"), std::string::npos) << err;
  }
}

TEST(Safetensors, MissingFileIsAnErrorNamingIt) {
  try {
    st::Reader::open("/nonexistent/dir/model.safetensors");
    FAIL();
  } catch (const lf::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/model.safetensors"), std::string::npos);
  }
}
