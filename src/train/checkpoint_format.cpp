#include "loongforge/train/checkpoint_format.h"

#include <ATen/Functions.h>
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loongforge/core/error.h"
#include "loongforge/core/mapped_file.h"
#include "loongforge/core/safetensors.h"

namespace lf::train::ckpt {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kMetaKey = "loongforge";
constexpr const char* kCorruptHint =
    "the checkpoint was damaged after it was written (or by a crash of the file system); load "
    "an older iteration (--load DIR with an explicit iter_NNNNNNN directory) or re-create it";

lf::safetensors::DType to_st(at::ScalarType t) {
  using D = lf::safetensors::DType;
  switch (t) {
    case at::kFloat: return D::F32;
    case at::kBFloat16: return D::BF16;
    case at::kHalf: return D::F16;
    case at::kDouble: return D::F64;
    case at::kLong: return D::I64;
    case at::kInt: return D::I32;
    case at::kByte: return D::U8;
    default: LF_FAIL("checkpoints cannot store tensors of type ", t);
  }
}

at::ScalarType from_st(lf::safetensors::DType t, const std::string& what) {
  using D = lf::safetensors::DType;
  switch (t) {
    case D::F32: return at::kFloat;
    case D::BF16: return at::kBFloat16;
    case D::F16: return at::kHalf;
    case D::F64: return at::kDouble;
    case D::I64: return at::kLong;
    case D::I32: return at::kInt;
    case D::U8: return at::kByte;
    default: LF_FAIL(what, " has dtype ", lf::safetensors::dtype_name(t), ", which checkpoints do not use");
  }
}

bool is_vocab_param(const std::string& name);

json piece_json(const Piece& p) {
  json j{{"param", p.param},
         {"kind", p.kind},
         {"global_shape", p.shard.global_shape},
         {"partition_dim", p.shard.partition_dim},
         {"blocks", p.shard.blocks},
         {"vocab", p.shard.vocab},
         {"tp_rank", p.shard.tp_rank},
         {"tp_size", p.shard.tp_size},
         {"offsets", p.shard.offsets()},
         {"flat_range", {p.flat_begin, p.flat_end}}};
  if (p.shard.outer > 1) j["outer"] = p.shard.outer;  // absent: 1 (checkpoints before two-level splits)
  return j;
}

Piece piece_from_json(const json& j, const std::string& what) {
  Piece p;
  try {
    p.param = j.at("param").get<std::string>();
    p.kind = j.at("kind").get<std::string>();
    p.shard.global_shape = j.at("global_shape").get<std::vector<int64_t>>();
    p.shard.partition_dim = j.at("partition_dim").get<int64_t>();
    p.shard.blocks = j.at("blocks").get<int64_t>();
    p.shard.vocab = j.value("vocab", is_vocab_param(p.param));
    p.shard.tp_rank = j.at("tp_rank").get<int>();
    p.shard.tp_size = j.at("tp_size").get<int>();
    p.shard.outer = j.value("outer", int64_t{1});
    const auto range = j.at("flat_range").get<std::vector<int64_t>>();
    LF_CHECK(range.size() == 2, what, ": flat_range needs two numbers");
    p.flat_begin = range[0];
    p.flat_end = range[1];
  } catch (const json::exception& e) {
    LF_FAIL(what, ": malformed shard metadata: ", e.what(), lf::hint(kCorruptHint));
  }
  p.shard.validate(what);
  LF_CHECK(p.flat_begin >= 0 && p.flat_begin <= p.flat_end && p.flat_end <= p.shard.shard_numel(),
           what, ": flat_range [", p.flat_begin, ", ", p.flat_end, ") lies outside its shard of ",
           p.shard.shard_numel(), " elements", lf::hint(kCorruptHint));
  return p;
}

std::string read_small_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LF_CHECK(in.good(), "cannot read ", path, lf::hint("check that the checkpoint directory is complete"));
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

bool is_vocab_param(const std::string& name) {
  auto ends = [&](const char* s) {
    const std::string suf(s);
    return name.size() >= suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0;
  };
  return ends("word_embeddings.weight") || ends("output_layer.weight");
}

std::string shape_str(const std::vector<int64_t>& s) { return json(s).dump(); }

}  // namespace

ShardSpec ShardSpec::of(const lf::parallel::Parameter& p) {
  ShardSpec s;
  s.global_shape = p.full_shape();
  s.partition_dim = p.sharding.dim;
  s.blocks = p.sharding.blocks;
  s.vocab = p.sharding.vocab;
  s.outer = p.sharding.outer;
  s.tp_rank = p.tp_rank;
  s.tp_size = p.tp_size;
  return s;
}

std::vector<int64_t> ShardSpec::shard_shape() const { return sharding().shard_shape(global_shape, tp_size); }

int64_t ShardSpec::shard_numel() const {
  int64_t n = 1;
  for (int64_t d : shard_shape()) n *= d;
  return n;
}

std::vector<int64_t> ShardSpec::offsets() const { return sharding().offsets(global_shape, tp_rank, tp_size); }

void ShardSpec::validate(const std::string& what) const {
  for (int64_t d : global_shape) LF_CHECK(d >= 0, what, ": negative dimension in ", shape_str(global_shape));
  LF_CHECK(tp_size >= 1 && tp_rank >= 0 && tp_rank < tp_size && blocks >= 1 && outer >= 1, what,
           ": bad split (tp rank ", tp_rank, " of ", tp_size, ", ", blocks, " blocks, ", outer, " parts)",
           lf::hint(kCorruptHint));
  if (outer > 1) {
    LF_CHECK(partition_dim >= 1 && tp_size % outer == 0 && !global_shape.empty() && global_shape[0] % outer == 0, what,
             ": bad two-level split (", outer, " parts along dim 0 of ", shape_str(global_shape), " over ", tp_size,
             " ranks, then dim ", partition_dim, ")", lf::hint(kCorruptHint));
    sharding().check(global_shape, tp_size, what);
    return;
  }
  if (partition_dim < 0) return;
  LF_CHECK(partition_dim < static_cast<int64_t>(global_shape.size()), what, ": partition dim ",
           partition_dim, " of a tensor of shape ", shape_str(global_shape), lf::hint(kCorruptHint));
  const int64_t d = global_shape[static_cast<size_t>(partition_dim)];
  LF_CHECK(d % (blocks * tp_size) == 0, what, ": dim ", partition_dim, " of shape ",
           shape_str(global_shape), " does not split into ", blocks, " block(s) x ", tp_size,
           " tensor-parallel ranks",
           lf::hint("choose a tensor-parallel size that divides the model's heads, groups, FFN and "
                    "(padded) vocabulary sizes"));
}

std::string entry_key(const Piece& p) {
  return p.kind == "param" || p.kind == "rng" ? p.param : p.param + "." + p.kind;
}

uint32_t crc32_of(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (size > 0) {  // zlib takes uInt lengths
    const uInt n = static_cast<uInt>(std::min<size_t>(size, 1u << 30));
    c = ::crc32(c, p, n);
    p += n;
    size -= n;
  }
  return static_cast<uint32_t>(c);
}

FileRecord write_entries(const std::string& path, const std::vector<Entry>& entries) {
  lf::safetensors::Writer w;
  json meta = json::object();
  for (const auto& e : entries) {
    LF_CHECK(e.data.device().is_cpu() && e.data.is_contiguous() &&
                 e.data.numel() == e.piece.flat_end - e.piece.flat_begin,
             "checkpoint entry ", entry_key(e.piece), " is not a contiguous CPU tensor of ",
             e.piece.flat_end - e.piece.flat_begin, " elements");
    const std::string key = entry_key(e.piece);
    w.add(key, to_st(e.data.scalar_type()), {e.data.numel()}, e.data.data_ptr());
    meta[key] = piece_json(e.piece);
  }
  w.set_metadata(kMetaKey, meta.dump());
  // The CRC of exactly what Writer::write puts on disk: u64 header length, header, data in order.
  const std::string header = w.header();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((header.size() >> (8 * i)) & 0xff);
  uint32_t crc = crc32_of(len, 8);
  crc = crc32_of(header.data(), header.size(), crc);
  for (const auto& e : entries)
    crc = crc32_of(e.data.data_ptr(), static_cast<size_t>(e.data.numel() * e.data.element_size()), crc);
  FileRecord r;
  r.bytes = w.write(path, /*fsync=*/true);
  r.crc32 = crc;
  return r;
}

FileRecord write_text(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  LF_CHECK(fd >= 0, "cannot create ", path, ": ", std::strerror(errno),
           lf::hint("check that the directory exists and is writable"));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int e = errno;
      ::close(fd);
      LF_FAIL("writing ", path, " failed: ", std::strerror(e), lf::hint("check free disk space"));
    }
    done += static_cast<size_t>(w);
  }
  const bool synced = ::fsync(fd) == 0;
  const int e = errno;
  ::close(fd);
  LF_CHECK(synced, "fsync of ", path, " failed: ", std::strerror(e));
  return {text.size(), crc32_of(text.data(), text.size())};
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  LF_CHECK(fd >= 0, "cannot open directory ", dir, ": ", std::strerror(errno));
  const bool ok = ::fsync(fd) == 0 || errno == EINVAL;  // some file systems cannot sync dirs
  const int e = errno;
  ::close(fd);
  LF_CHECK(ok, "fsync of directory ", dir, " failed: ", std::strerror(e));
}

void durable_rename(const std::string& from, const std::string& to) {
  LF_CHECK(::rename(from.c_str(), to.c_str()) == 0, "cannot rename ", from, " to ", to, ": ",
           std::strerror(errno));
  fsync_dir(fs::path(to).parent_path().string());
}

std::string iteration_dir_name(int64_t iteration) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "iter_%07lld", static_cast<long long>(iteration));
  return buf;
}

std::optional<int64_t> parse_iteration_dir(const std::string& name) {
  if (name.size() < 6 || name.compare(0, 5, "iter_") != 0) return std::nullopt;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || v > (int64_t{1} << 56)) return std::nullopt;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

std::optional<int64_t> read_tracker(const std::string& save_dir) {
  const std::string path = (fs::path(save_dir) / kTrackerFile).string();
  if (!fs::exists(path)) return std::nullopt;
  std::string text = read_small_file(path);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ' || text.back() == '\r')) text.pop_back();
  int64_t v = -1;
  bool ok = !text.empty() && text.size() < 19;
  for (char c : text) ok = ok && c >= '0' && c <= '9';
  if (ok) v = std::stoll(text);
  LF_CHECK(ok, path, " does not hold an iteration number (found '", text.substr(0, 40), "')",
           lf::hint("write the iteration to load into it, or pass an iter_NNNNNNN directory to --load"));
  return v;
}

void write_tracker(const std::string& save_dir, int64_t iteration) {
  const std::string path = (fs::path(save_dir) / kTrackerFile).string();
  write_text(path + ".tmp", std::to_string(iteration) + "\n");
  durable_rename(path + ".tmp", path);
}

std::optional<std::string> resolve_checkpoint_dir(const std::string& load_dir, int64_t iteration) {
  if (fs::exists(fs::path(load_dir) / kManifestFile)) return load_dir;
  if (iteration < 0) {
    auto t = read_tracker(load_dir);
    if (!t) return std::nullopt;
    iteration = *t;
  }
  const std::string dir = (fs::path(load_dir) / iteration_dir_name(iteration)).string();
  LF_CHECK(fs::exists(fs::path(dir) / kManifestFile), "checkpoint ", dir,
           " does not exist or is incomplete (no ", kManifestFile, ")",
           lf::hint("list the iter_* directories of " + load_dir +
                    " and pass one of them to --load, or fix latest_checkpointed_iteration.txt"));
  return dir;
}

// ---------------------------------------------------------------------------------------------

CheckpointReader::CheckpointReader(std::string dir) : dir_(std::move(dir)) {
  const std::string mpath = (fs::path(dir_) / kManifestFile).string();
  json m;
  try {
    m = json::parse(read_small_file(mpath));
    LF_CHECK(m.at("format").get<std::string>() == "loongforge-checkpoint", mpath,
             " is not a LoongForge checkpoint manifest");
    const int version = m.at("version").get<int>();
    LF_CHECK(version >= kOldestReadableVersion && version <= kFormatVersion, mpath, " has format version ", version,
             "; this build reads ", kOldestReadableVersion, " to ", kFormatVersion,
             lf::hint("use the LoongForge version that wrote it to convert it"));
    iteration_ = m.at("iteration").get<int64_t>();
    for (const auto& [name, rec] : m.at("files").items()) {
      LF_CHECK(name.find('/') == std::string::npos && name != ".." && !name.empty(), mpath,
               " names a file outside the checkpoint: ", name);
      files_[name] = FileRecord{rec.at("bytes").get<uint64_t>(), rec.at("crc32").get<uint32_t>()};
    }
  } catch (const json::exception& e) {
    LF_FAIL(mpath, " is malformed: ", e.what(), lf::hint(kCorruptHint));
  }
  for (const auto& [name, rec] : files_) {
    const fs::path p = fs::path(dir_) / name;
    std::error_code ec;
    const auto size = fs::file_size(p, ec);
    LF_CHECK(!ec, "checkpoint file ", p.string(), " is missing (listed in ", kManifestFile, ")",
             lf::hint(kCorruptHint));
    LF_CHECK(size == rec.bytes, "checkpoint file ", p.string(), " has ", size, " bytes, the manifest says ",
             rec.bytes, " (truncated or overwritten)", lf::hint(kCorruptHint));
  }
  if (files_.count(kStateFile)) {
    const std::string spath = (fs::path(dir_) / kStateFile).string();
    state_json_ = read_small_file(spath);
    LF_CHECK(crc32_of(state_json_.data(), state_json_.size()) == files_[kStateFile].crc32,
             "checkpoint file ", spath, " fails its checksum (corrupt)", lf::hint(kCorruptHint));
    try {
      auto s = json::parse(state_json_);
      if (s.contains("params")) param_order_ = s.at("params").get<std::vector<std::string>>();
    } catch (const json::exception& e) {
      LF_FAIL(spath, " is malformed: ", e.what(), lf::hint(kCorruptHint));
    }
  }
}

CheckpointReader::~CheckpointReader() = default;

std::string CheckpointReader::config_yaml() const {
  if (!files_.count(kConfigFile)) return {};
  const std::string path = (fs::path(dir_) / kConfigFile).string();
  std::string text = read_small_file(path);
  LF_CHECK(crc32_of(text.data(), text.size()) == files_.at(kConfigFile).crc32, "checkpoint file ",
           path, " fails its checksum (corrupt)", lf::hint(kCorruptHint));
  return text;
}

const lf::safetensors::Reader& CheckpointReader::reader(const std::string& file) {
  auto it = readers_.find(file);
  if (it != readers_.end()) return *it->second;
  LF_CHECK(files_.count(file), "checkpoint ", dir_, " has no file ", file, " in its manifest",
           lf::hint("a shard is missing: the checkpoint is incomplete"));
  const std::string path = (fs::path(dir_) / file).string();
  auto mapped = std::make_shared<lf::MappedFile>(path);
  LF_CHECK(static_cast<uint64_t>(mapped->size()) == files_[file].bytes, "checkpoint file ", path,
           " has ", mapped->size(), " bytes, the manifest says ", files_[file].bytes,
           " (truncated)", lf::hint(kCorruptHint));
  LF_CHECK(crc32_of(mapped->data(), static_cast<size_t>(mapped->size())) == files_[file].crc32,
           "checkpoint file ", path, " fails its CRC-32 checksum (corrupt)", lf::hint(kCorruptHint));
  auto r = std::make_unique<lf::safetensors::Reader>(lf::safetensors::Reader::from_bytes(
      std::string_view(reinterpret_cast<const char*>(mapped->data()), static_cast<size_t>(mapped->size())),
      path));
  mapped_.push_back(std::move(mapped));
  return *(readers_[file] = std::move(r));
}

void CheckpointReader::index_file(const std::string& file) {
  const auto& r = reader(file);
  auto mit = r.metadata().find(kMetaKey);
  LF_CHECK(mit != r.metadata().end(), r.source(), " has no LoongForge shard metadata",
           lf::hint("it is not a LoongForge checkpoint shard"));
  json meta;
  try {
    meta = json::parse(mit->second);
  } catch (const json::exception& e) {
    LF_FAIL(r.source(), ": malformed shard metadata: ", e.what(), lf::hint(kCorruptHint));
  }
  LF_CHECK(meta.is_object(), r.source(), ": shard metadata is not an object", lf::hint(kCorruptHint));
  for (const auto& [key, pj] : meta.items()) {
    const std::string what = r.source() + ": tensor '" + key + "'";
    Piece p = piece_from_json(pj, what);
    const auto& info = r.at(key);
    LF_CHECK(info.numel() == p.flat_end - p.flat_begin, what, " has ", info.numel(),
             " elements, its metadata says ", p.flat_end - p.flat_begin, lf::hint(kCorruptHint));
    from_st(info.dtype, what);
    pieces_[{p.param, p.kind}].push_back({file, key, std::move(p)});
  }
}

std::vector<std::string> CheckpointReader::params(const std::string& kind) {
  has("", "");  // builds the index
  std::vector<std::string> out;
  for (const auto& n : param_order_)
    if (pieces_.count({n, kind})) out.push_back(n);
  for (const auto& [k, v] : pieces_)
    if (k.second == kind && std::find(out.begin(), out.end(), k.first) == out.end()) out.push_back(k.first);
  return out;
}

bool CheckpointReader::has(const std::string& param, const std::string& kind) {
  if (!indexed_) {
    for (const auto& [name, rec] : files_)
      if (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0) index_file(name);
    indexed_ = true;
  }
  return pieces_.count({param, kind}) > 0;
}

ShardSpec CheckpointReader::layout_of(const std::string& param, const std::string& kind) {
  LF_CHECK(has(param, kind), "checkpoint ", dir_, " has no ", kind, " tensor for ", param,
           lf::hint("the checkpoint belongs to a different model (compare its config.yaml)"));
  return pieces_.at({param, kind}).front().piece.shard;
}

at::Tensor CheckpointReader::full(const std::string& param, const std::string& kind) {
  LF_CHECK(has(param, kind), "checkpoint ", dir_, " has no ", kind, " tensor for ", param,
           lf::hint(kind == "param" ? "the checkpoint belongs to a different model (compare its config.yaml)"
                                    : "it was saved without optimizer state: pass --no-load-optim or --finetune"));
  const auto& locs = pieces_.at({param, kind});
  const ShardSpec& s0 = locs.front().piece.shard;
  const auto dtype = from_st(reader(locs.front().file).at(locs.front().key).dtype, param);
  const std::string what = "checkpoint " + dir_ + ": " + kind + " of " + param;
  // Per TP rank: the local shard's flat buffer and the ranges that filled it.
  std::map<int, std::pair<at::Tensor, std::vector<std::pair<int64_t, int64_t>>>> shards;
  for (const auto& l : locs) {
    const ShardSpec& s = l.piece.shard;
    LF_CHECK(s.global_shape == s0.global_shape && s.partition_dim == s0.partition_dim &&
                 s.blocks == s0.blocks && s.outer == s0.outer && s.tp_size == s0.tp_size,
             what, ": pieces disagree on the tensor's shape or split (", shape_str(s.global_shape),
             " vs ", shape_str(s0.global_shape), ")", lf::hint(kCorruptHint));
    const auto& info = reader(l.file).at(l.key);
    LF_CHECK(from_st(info.dtype, what) == dtype, what, ": pieces have different dtypes", lf::hint(kCorruptHint));
    auto& [buf, ranges] = shards[s.tp_rank];
    if (!buf.defined()) buf = at::empty({s.shard_numel()}, at::TensorOptions().dtype(dtype));
    const int64_t es = buf.element_size();
    std::memcpy(static_cast<char*>(buf.data_ptr()) + l.piece.flat_begin * es, reader(l.file).data(info),
                static_cast<size_t>(info.end - info.begin));
    ranges.emplace_back(l.piece.flat_begin, l.piece.flat_end);
  }
  const int want_ranks = s0.partition_dim < 0 ? 1 : s0.tp_size;
  LF_CHECK(static_cast<int>(shards.size()) == want_ranks && shards.begin()->first == 0 &&
               shards.rbegin()->first == want_ranks - 1,
           what, ": has pieces of ", shards.size(), " tensor-parallel shard(s), needs ", want_ranks,
           lf::hint("a shard file is missing from the checkpoint"));
  at::Tensor out = at::empty(s0.global_shape, at::TensorOptions().dtype(dtype));
  for (auto& [rank, sr] : shards) {
    auto& ranges = sr.second;
    std::sort(ranges.begin(), ranges.end());
    int64_t at_ = 0;
    for (const auto& [b, e] : ranges) {
      LF_CHECK(b == at_, what, " (tensor-parallel shard ", rank, "): elements [", std::min(b, at_), ", ",
               std::max(b, at_), ") are ", b > at_ ? "missing" : "stored twice",
               lf::hint("a data-parallel shard file is missing or the checkpoint mixes two saves"));
      at_ = e;
    }
    ShardSpec s = s0;
    s.tp_rank = rank;
    LF_CHECK(at_ == s.shard_numel(), what, " (tensor-parallel shard ", rank, "): elements [", at_, ", ",
             s.shard_numel(), ") are missing", lf::hint("a data-parallel shard file is missing"));
    at::Tensor local = sr.first.view(s.shard_shape());
    if (s.partition_dim < 0) {
      out.copy_(local);
      continue;
    }
    const auto at0 = s.offsets();
    at::Tensor part = out;  // two-level split: this rank's part along dim 0 first
    if (s.outer > 1) part = out.narrow(0, at0[0], s.global_shape[0] / s.outer);
    const int64_t d = s.partition_dim, blk = part.size(d) / s.blocks, piece = local.size(d) / s.blocks;
    for (int64_t b = 0; b < s.blocks; ++b)
      part.narrow(d, b * blk + at0[static_cast<size_t>(d)], piece).copy_(local.narrow(d, b * piece, piece));
  }
  return out;
}

at::Tensor cut_shard(const at::Tensor& full, const ShardSpec& spec) {
  return spec.sharding().shard(full, spec.tp_rank, spec.tp_size);
}

at::Tensor CheckpointReader::shard(const std::string& param, const std::string& kind,
                                   const ShardSpec& want, at::ScalarType dtype) {
  at::Tensor full_t = full(param, kind);
  const auto have = full_t.sizes().vec();
  if (have != want.global_shape) {
    bool vocab_only = want.vocab && have.size() == want.global_shape.size() && !have.empty();
    for (size_t i = 1; vocab_only && i < have.size(); ++i) vocab_only = have[i] == want.global_shape[i];
    LF_CHECK(vocab_only, "checkpoint ", dir_, ": ", param, " has shape ", shape_str(have),
             ", the model expects ", shape_str(want.global_shape),
             lf::hint("the model configuration differs from the checkpoint's (see its config.yaml)"));
    // Vocabulary padding depends on TP (padded_vocab_size): rows past the real vocabulary are zero.
    const int64_t keep = std::min(have[0], want.global_shape[0]);
    if (have[0] > keep)
      LF_CHECK(full_t.narrow(0, keep, have[0] - keep).count_nonzero().item<int64_t>() == 0, "checkpoint ",
               dir_, ": ", param, " has ", have[0], " vocabulary rows, the model ", want.global_shape[0],
               ", and the rows it would drop are not padding",
               lf::hint("the vocabulary size differs from the checkpoint's (see its config.yaml)"));
    at::Tensor resized = at::zeros(want.global_shape, full_t.options());
    resized.narrow(0, 0, keep).copy_(full_t.narrow(0, 0, keep));
    full_t = resized;
  }
  want.validate(param);
  return cut_shard(full_t, want).to(dtype);
}

std::vector<uint8_t> CheckpointReader::bytes(const std::string& file, const std::string& key) {
  const auto& r = reader(file);
  const auto& info = r.at(key);
  LF_CHECK(info.dtype == lf::safetensors::DType::U8, r.source(), ": ", key, " is not a U8 tensor");
  const unsigned char* p = r.data(info);
  return std::vector<uint8_t>(p, p + (info.end - info.begin));
}

}  // namespace lf::train::ckpt
