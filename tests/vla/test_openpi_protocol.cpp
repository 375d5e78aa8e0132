// OpenPI's message codec (openpi_protocol.h): observations round-trip, nested maps flatten, numpy
// dtypes map to ATen's, replies carry float32 actions, and malformed messages are errors naming
// what was wrong. (The real openpi-client against the server: test_serve_policy_program.cpp.)
#include <gtest/gtest.h>

#include <ATen/Functions.h>

#include <msgpack.hpp>

#include "../support/error_message.h"
#include "loongforge/core/error.h"
#include "loongforge/vla/openpi_protocol.h"

namespace {
using namespace lf::vla;

using lf::testing::error_message;

TEST(OpenpiProtocol, ObservationsRoundTrip) {
  Observation o;
  o.arrays["observation/image"] = at::randint(0, 256, {8, 6, 3}, at::kByte);
  o.arrays["observation/state"] = at::randn({3});
  o.arrays["x/f64"] = at::randn({2, 2}, at::kDouble);
  o.arrays["x/i64"] = at::arange(5, at::kLong);
  o.arrays["x/i32"] = at::arange(5, at::kInt);
  o.arrays["x/bool"] = at::arange(4, at::kLong).remainder(2).to(at::kBool);
  o.arrays["x/scalar"] = at::scalar_tensor(4, at::kLong);
  o.prompt = "put the red block on the blue target";
  const Observation d = openpi::decode_observation(openpi::encode_observation(o));
  EXPECT_EQ(d.prompt, o.prompt);
  ASSERT_EQ(d.arrays.size(), o.arrays.size());
  for (const auto& [name, t] : o.arrays) {
    EXPECT_EQ(d.at(name).scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(at::equal(d.at(name), t)) << name;
  }
}

// Builds msgpack by hand, as Python's msgpack packs (keys of ndarrays as bin).
struct Msg {
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk{&buf};
  void str(const std::string& s) { pk.pack_str(static_cast<uint32_t>(s.size())), pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size())); }
  void bin(const std::string& s) { pk.pack_bin(static_cast<uint32_t>(s.size())), pk.pack_bin_body(s.data(), static_cast<uint32_t>(s.size())); }
  void ndarray(const std::string& data, const std::string& dtype, std::vector<int64_t> shape) {
    pk.pack_map(4);
    bin("__ndarray__"), pk.pack_true();
    bin("data"), bin(data);
    bin("dtype"), str(dtype);
    bin("shape"), pk.pack_array(static_cast<uint32_t>(shape.size()));
    for (auto s : shape) pk.pack_int64(s);
  }
  std::string bytes() const { return {buf.data(), buf.size()}; }
};

TEST(OpenpiProtocol, NestedMapsScalarsAndLists) {
  Msg m;
  m.pk.pack_map(5);
  m.str("images"), m.pk.pack_map(1), m.str("cam_high"), m.ndarray(std::string(12, '\x07'), "|u1", {2, 2, 3});
  m.str("state"), m.pk.pack_array(2), m.pk.pack_double(0.5), m.pk.pack_int64(2);
  m.str("speed"), m.pk.pack_double(1.5);
  m.str("task_name"), m.str("ignored");
  m.str("prompt"), m.str("hello");
  const Observation o = openpi::decode_observation(m.bytes());
  EXPECT_EQ(o.prompt, "hello");
  EXPECT_EQ(o.at("images/cam_high").sizes(), (std::vector<int64_t>{2, 2, 3}));
  EXPECT_EQ(o.at("images/cam_high")[1][1][2].item<int64_t>(), 7);
  EXPECT_TRUE(at::allclose(o.at("state"), at::tensor({0.5, 2.0}, at::kDouble)));
  EXPECT_EQ(o.at("speed").item<double>(), 1.5);
  EXPECT_FALSE(o.has("task_name"));
}

TEST(OpenpiProtocol, MalformedMessagesNameWhatIsWrong) {
  EXPECT_NE(error_message([] { openpi::decode_observation(std::string("\xc1", 1)); }).find("not msgpack"), std::string::npos);
  EXPECT_NE(error_message([] { openpi::decode_observation(openpi::encode_json({1, 2})); }).find("is a list, not a map"),
            std::string::npos);
  EXPECT_NE(error_message([] { openpi::decode_observation(openpi::encode_json({{"a", 1}}) + "x"); }).find("after its msgpack"),
            std::string::npos);
  EXPECT_NE(error_message([] { openpi::decode_observation(openpi::encode_json({{"prompt", 3}})); })
                .find("'prompt' is an integer, not a string"),
            std::string::npos);
  {
    Msg m;
    m.pk.pack_map(1), m.str("observation/state"), m.ndarray(std::string(8, '\0'), "<f4", {3});
    const auto e = error_message([&] { openpi::decode_observation(m.bytes()); });
    EXPECT_NE(e.find("'observation/state': 8 bytes of data for dtype <f4 and shape [3] (12 expected)"), std::string::npos) << e;
  }
  {
    Msg m;
    m.pk.pack_map(1), m.str("x"), m.ndarray(std::string(8, '\0'), "<u8", {1});
    const auto e = error_message([&] { openpi::decode_observation(m.bytes()); });
    EXPECT_NE(e.find("'x': unsupported dtype '<u8'"), std::string::npos) << e;
  }
}

TEST(OpenpiProtocol, RepliesAndMetadata) {
  const at::Tensor a = at::randn({5, 3});
  const auto r = openpi::decode_reply(openpi::encode_reply(a, {{"server_timing", {{"infer_ms", 1.5}}}}));
  EXPECT_TRUE(at::equal(r.actions, a));
  EXPECT_EQ(r.rest["server_timing"]["infer_ms"], 1.5);
  const nlohmann::json meta = {{"policy", "expert"}, {"action_dim", 3}, {"list", {1, -2, 0.5, true, nullptr}}};
  EXPECT_EQ(openpi::decode_json(openpi::encode_json(meta)), meta);
  EXPECT_THROW(openpi::decode_reply(openpi::encode_json({{"server_timing", 1}})), lf::Error);
}

}  // namespace
