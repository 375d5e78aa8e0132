#include "loongforge/vla/openpi_protocol.h"

#include <ATen/Functions.h>

#include <cstring>
#include <msgpack.hpp>

#include "loongforge/core/error.h"

namespace lf::vla::openpi {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

struct DType {
  const char* str;
  at::ScalarType type;
  size_t bytes;
};
const std::vector<DType>& dtypes() {
  static const std::vector<DType> d = {{"<f4", at::kFloat, 4}, {"<f8", at::kDouble, 8}, {"<f2", at::kHalf, 2},
                                       {"|u1", at::kByte, 1},  {"|i1", at::kChar, 1},   {"<i2", at::kShort, 2},
                                       {"<i4", at::kInt, 4},   {"<i8", at::kLong, 8},   {"|b1", at::kBool, 1}};
  return d;
}
std::string dtype_list() {
  std::string s;
  for (const auto& d : dtypes()) s += (s.empty() ? "" : ", ") + std::string(d.str);
  return s;
}

std::string type_name(const msgpack::object& o) {
  switch (o.type) {
    case msgpack::type::NIL: return "nil";
    case msgpack::type::BOOLEAN: return "a bool";
    case msgpack::type::POSITIVE_INTEGER:
    case msgpack::type::NEGATIVE_INTEGER: return "an integer";
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: return "a float";
    case msgpack::type::STR: return "a string";
    case msgpack::type::BIN: return "bytes";
    case msgpack::type::ARRAY: return "a list";
    case msgpack::type::MAP: return "a map";
    default: return "an extension type";
  }
}

bool is_text(const msgpack::object& o) { return o.type == msgpack::type::STR || o.type == msgpack::type::BIN; }
std::string text(const msgpack::object& o) {
  if (o.type == msgpack::type::STR) return {o.via.str.ptr, o.via.str.size};
  return {o.via.bin.ptr, o.via.bin.size};
}

// The value under `key` (a str or bin key) of a map, or nullptr.
const msgpack::object* find(const msgpack::object& map, const std::string& key) {
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    const auto& kv = map.via.map.ptr[i];
    if (is_text(kv.key) && text(kv.key) == key) return &kv.val;
  }
  return nullptr;
}

msgpack::object_handle unpack(const std::string& message) {
  size_t offset = 0;
  msgpack::object_handle h;
  try {
    h = msgpack::unpack(message.data(), message.size(), offset);
  } catch (const std::exception& e) {
    LF_FAIL("the message (", message.size(), " bytes) is not msgpack: ", e.what());
  }
  LF_CHECK(offset == message.size(), "the message has ", message.size() - offset,
           " bytes after its msgpack value (", message.size(), " bytes in all)");
  return h;
}

at::Tensor decode_ndarray(const msgpack::object& m, const std::string& name) {
  const msgpack::object *data = find(m, "data"), *dtype = find(m, "dtype"), *shape = find(m, "shape");
  LF_CHECK(data && dtype && shape, "'", name, "': an __ndarray__ needs data, dtype and shape");
  LF_CHECK(is_text(*data), "'", name, "': the ndarray's data is ", type_name(*data), ", not bytes");
  LF_CHECK(dtype->type == msgpack::type::STR, "'", name, "': the ndarray's dtype is ", type_name(*dtype),
           ", not a string");
  LF_CHECK(shape->type == msgpack::type::ARRAY, "'", name, "': the ndarray's shape is ", type_name(*shape),
           ", not a list");
  const std::string dt = text(*dtype);
  const DType* d = nullptr;
  for (const auto& c : dtypes())
    if (dt == c.str) d = &c;
  LF_CHECK(d, "'", name, "': unsupported dtype '", dt, "' (supported: ", dtype_list(), ")");
  std::vector<int64_t> dims;
  int64_t n = 1;
  for (uint32_t i = 0; i < shape->via.array.size; ++i) {
    const auto& s = shape->via.array.ptr[i];
    LF_CHECK(s.type == msgpack::type::POSITIVE_INTEGER && s.via.u64 < (1ull << 40), "'", name,
             "': the ndarray's shape holds ", type_name(s), ", not a dimension");
    dims.push_back(static_cast<int64_t>(s.via.u64));
    n *= dims.back();
    LF_CHECK(n < (1ll << 40), "'", name, "': the ndarray's shape is too large");
  }
  const std::string bytes = text(*data);
  LF_CHECK(bytes.size() == static_cast<size_t>(n) * d->bytes, "'", name, "': ", bytes.size(),
           " bytes of data for dtype ", dt, " and shape ", at::IntArrayRef(dims), " (", n * static_cast<int64_t>(d->bytes),
           " expected)");
  at::Tensor t = at::empty(dims, d->type);
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
  return t;
}

at::Tensor decode_scalar(const msgpack::object& o, const std::string& name) {
  switch (o.type) {
    case msgpack::type::BOOLEAN: return at::scalar_tensor(o.via.boolean, at::kBool);
    case msgpack::type::POSITIVE_INTEGER:
      LF_CHECK(o.via.u64 <= static_cast<uint64_t>(INT64_MAX), "'", name, "': ", o.via.u64, " is too large");
      return at::scalar_tensor(static_cast<int64_t>(o.via.u64), at::kLong);
    case msgpack::type::NEGATIVE_INTEGER: return at::scalar_tensor(o.via.i64, at::kLong);
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: return at::scalar_tensor(o.via.f64, at::kDouble);
    default: LF_FAIL("'", name, "' is ", type_name(o), ", not a number");
  }
}

void flatten(const msgpack::object& map, const std::string& prefix, Observation& obs, int depth) {
  LF_CHECK(depth < 16, "the observation nests maps deeper than 16 levels");
  for (uint32_t i = 0; i < map.via.map.size; ++i) {
    const auto& kv = map.via.map.ptr[i];
    LF_CHECK(is_text(kv.key), "the observation", prefix.empty() ? "" : " map '" + prefix + "'", " has a key that is ",
             type_name(kv.key), ", not a string");
    const std::string name = prefix.empty() ? text(kv.key) : prefix + "/" + text(kv.key);
    const msgpack::object& v = kv.val;
    if (name == "prompt") {
      LF_CHECK(v.type == msgpack::type::STR, "'prompt' is ", type_name(v), ", not a string");
      obs.prompt = text(v);
    } else if (v.type == msgpack::type::MAP && find(v, "__ndarray__")) {
      obs.arrays[name] = decode_ndarray(v, name);
    } else if (v.type == msgpack::type::MAP && find(v, "__npgeneric__")) {
      const msgpack::object *data = find(v, "data"), *dtype = find(v, "dtype");
      LF_CHECK(data && dtype && dtype->type == msgpack::type::STR, "'", name,
               "': a __npgeneric__ needs data and a dtype string");
      const std::string dt = text(*dtype);
      const DType* d = nullptr;
      for (const auto& c : dtypes())
        if (dt == c.str) d = &c;
      LF_CHECK(d, "'", name, "': unsupported dtype '", dt, "' (supported: ", dtype_list(), ")");
      obs.arrays[name] = decode_scalar(*data, name).to(d->type);
    } else if (v.type == msgpack::type::MAP) {
      flatten(v, name, obs, depth + 1);
    } else if (v.type == msgpack::type::ARRAY) {
      std::vector<at::Tensor> items;
      for (uint32_t j = 0; j < v.via.array.size; ++j)
        items.push_back(decode_scalar(v.via.array.ptr[j], name + "[" + std::to_string(j) + "]"));
      obs.arrays[name] = items.empty() ? at::empty({0}, at::kDouble) : at::stack(items);
    } else if (v.type == msgpack::type::STR || v.type == msgpack::type::NIL) {
      // Other strings and nil: nothing a policy reads.
    } else {
      obs.arrays[name] = decode_scalar(v, name);
    }
  }
}

void pack_text(Packer& pk, const std::string& s, bool bin) {
  if (bin) {
    pk.pack_bin(static_cast<uint32_t>(s.size()));
    pk.pack_bin_body(s.data(), static_cast<uint32_t>(s.size()));
  } else {
    pk.pack_str(static_cast<uint32_t>(s.size()));
    pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
  }
}

void pack_ndarray(Packer& pk, const at::Tensor& in, const std::string& name) {
  at::Tensor t = in.to(at::kCPU).contiguous();
  if (t.scalar_type() == at::kBFloat16) t = t.to(at::kFloat);
  const DType* d = nullptr;
  for (const auto& c : dtypes())
    if (t.scalar_type() == c.type) d = &c;
  LF_CHECK(d, "'", name, "': no numpy dtype for ", t.scalar_type());
  pk.pack_map(4);
  pack_text(pk, "__ndarray__", true);
  pk.pack_true();
  pack_text(pk, "data", true);
  const size_t n = static_cast<size_t>(t.numel()) * d->bytes;
  pk.pack_bin(static_cast<uint32_t>(n));
  pk.pack_bin_body(static_cast<const char*>(t.data_ptr()), static_cast<uint32_t>(n));
  pack_text(pk, "dtype", true);
  pack_text(pk, d->str, false);
  pack_text(pk, "shape", true);
  pk.pack_array(static_cast<uint32_t>(t.dim()));
  for (int64_t s : t.sizes()) pk.pack_int64(s);
}

void pack_json(Packer& pk, const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null: pk.pack_nil(); break;
    case nlohmann::json::value_t::boolean: v.get<bool>() ? pk.pack_true() : pk.pack_false(); break;
    case nlohmann::json::value_t::number_integer: pk.pack_int64(v.get<int64_t>()); break;
    case nlohmann::json::value_t::number_unsigned: pk.pack_uint64(v.get<uint64_t>()); break;
    case nlohmann::json::value_t::number_float: pk.pack_double(v.get<double>()); break;
    case nlohmann::json::value_t::string: pack_text(pk, v.get<std::string>(), false); break;
    case nlohmann::json::value_t::array:
      pk.pack_array(static_cast<uint32_t>(v.size()));
      for (const auto& e : v) pack_json(pk, e);
      break;
    case nlohmann::json::value_t::object:
      pk.pack_map(static_cast<uint32_t>(v.size()));
      for (const auto& [k, e] : v.items()) {
        pack_text(pk, k, false);
        pack_json(pk, e);
      }
      break;
    default: LF_FAIL("cannot encode a JSON ", v.type_name(), " as msgpack");
  }
}

nlohmann::json to_json(const msgpack::object& o) {
  switch (o.type) {
    case msgpack::type::NIL: return nullptr;
    case msgpack::type::BOOLEAN: return o.via.boolean;
    case msgpack::type::POSITIVE_INTEGER: return o.via.u64;
    case msgpack::type::NEGATIVE_INTEGER: return o.via.i64;
    case msgpack::type::FLOAT32:
    case msgpack::type::FLOAT64: return o.via.f64;
    case msgpack::type::STR:
    case msgpack::type::BIN: return text(o);
    case msgpack::type::ARRAY: {
      nlohmann::json a = nlohmann::json::array();
      for (uint32_t i = 0; i < o.via.array.size; ++i) a.push_back(to_json(o.via.array.ptr[i]));
      return a;
    }
    case msgpack::type::MAP: {
      if (find(o, "__ndarray__")) {
        const auto* dtype = find(o, "dtype");
        const auto* shape = find(o, "shape");
        return {{"dtype", dtype ? to_json(*dtype) : nullptr}, {"shape", shape ? to_json(*shape) : nullptr}};
      }
      nlohmann::json m = nlohmann::json::object();
      for (uint32_t i = 0; i < o.via.map.size; ++i) {
        const auto& kv = o.via.map.ptr[i];
        m[is_text(kv.key) ? text(kv.key) : to_json(kv.key).dump()] = to_json(kv.val);
      }
      return m;
    }
    default: return "<extension>";
  }
}

}  // namespace

Observation decode_observation(const std::string& message) {
  const auto h = unpack(message);
  LF_CHECK(h.get().type == msgpack::type::MAP, "the observation is ", type_name(h.get()),
           ", not a map of names to arrays");
  Observation obs;
  flatten(h.get(), "", obs, 0);
  return obs;
}

std::string encode_observation(const Observation& obs) {
  msgpack::sbuffer buf;
  Packer pk(&buf);
  pk.pack_map(static_cast<uint32_t>(obs.arrays.size() + (obs.prompt.empty() ? 0 : 1)));
  for (const auto& [name, t] : obs.arrays) {
    pack_text(pk, name, false);
    pack_ndarray(pk, t, name);
  }
  if (!obs.prompt.empty()) {
    pack_text(pk, "prompt", false);
    pack_text(pk, obs.prompt, false);
  }
  return {buf.data(), buf.size()};
}

std::string encode_json(const nlohmann::json& value) {
  msgpack::sbuffer buf;
  Packer pk(&buf);
  pack_json(pk, value);
  return {buf.data(), buf.size()};
}

nlohmann::json decode_json(const std::string& message) { return to_json(unpack(message).get()); }

std::string encode_reply(const at::Tensor& actions, const nlohmann::json& extra) {
  LF_CHECK(extra.is_object(), "a reply's extra entries are a JSON object");
  msgpack::sbuffer buf;
  Packer pk(&buf);
  pk.pack_map(static_cast<uint32_t>(1 + extra.size()));
  pack_text(pk, "actions", false);
  pack_ndarray(pk, actions.to(at::kFloat), "actions");
  for (const auto& [k, v] : extra.items()) {
    pack_text(pk, k, false);
    pack_json(pk, v);
  }
  return {buf.data(), buf.size()};
}

Reply decode_reply(const std::string& message) {
  const auto h = unpack(message);
  const msgpack::object& o = h.get();
  LF_CHECK(o.type == msgpack::type::MAP, "the reply is ", type_name(o), ", not a map");
  Reply r;
  r.rest = nlohmann::json::object();
  for (uint32_t i = 0; i < o.via.map.size; ++i) {
    const auto& kv = o.via.map.ptr[i];
    const std::string key = is_text(kv.key) ? text(kv.key) : to_json(kv.key).dump();
    if (key == "actions") {
      LF_CHECK(kv.val.type == msgpack::type::MAP && find(kv.val, "__ndarray__"), "the reply's 'actions' is ",
               type_name(kv.val), ", not an ndarray");
      r.actions = decode_ndarray(kv.val, "actions").to(at::kFloat);
    } else {
      r.rest[key] = to_json(kv.val);
    }
  }
  LF_CHECK(r.actions.defined(), "the reply has no 'actions' (it has: ", r.rest.dump(), ")");
  return r;
}

}  // namespace lf::vla::openpi
