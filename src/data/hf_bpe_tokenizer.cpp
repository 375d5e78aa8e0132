// HfBpeTokenizer encode/decode: added-token split, normalizer, pre-tokenizer steps, BPE merges.
#include "loongforge/data/hf_bpe_tokenizer.h"

#include <algorithm>
#include <map>
#include <memory>

#include "bpe_model.h"
#include "loongforge/core/error.h"
#include "pcre_regex.h"
#include "unicode.h"

namespace lf::data {
namespace detail {

// Per-instance encoding state: regex match data per step and the word -> ids cache.
struct EncoderState {
  explicit EncoderState(const BpeModel& m) {
    for (const auto& s : m.steps)
      matchers.push_back(s.regex ? std::make_unique<RegexMatcher>(s.regex) : nullptr);
  }
  std::vector<std::unique_ptr<RegexMatcher>> matchers;
  struct Span { uint32_t offset, count; };
  StringMap<Span> cache;  // raw piece bytes -> ids in pool
  std::vector<int32_t> pool;
  // When set (offsets of a SentencePiece-style encode), bpe_piece appends each token's length in
  // the piece's bytes here, in step with the ids (an unk's length is the unknown characters').
  std::vector<int32_t>* lens = nullptr;
  struct Symbol { int32_t id, prev, next, len; };
  std::vector<Symbol> symbols;
  struct Candidate {
    int32_t rank, pos, new_id;
    bool operator<(const Candidate& o) const {  // priority_queue top = lowest rank, then leftmost
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::vector<Candidate> heap;
  std::string normalized;
};

}  // namespace detail

namespace {
// Words longer than this are merged but not cached (long whitespace or digit runs would
// otherwise fill the cache with one-off keys). The cache is dropped when it grows too large.
constexpr size_t kMaxCachedWord = 128;
constexpr size_t kMaxCacheEntries = 1 << 20;
}  // namespace

namespace {
void check_normalized_added_tokens(const detail::BpeModel& m);
}  // namespace

HfBpeTokenizer::HfBpeTokenizer(const std::string& path) : HfBpeTokenizer(detail::load_bpe_model(path)) {
  check_normalized_added_tokens(*model_);
}

HfBpeTokenizer::HfBpeTokenizer(std::shared_ptr<const detail::BpeModel> model)
    : model_(std::move(model)), state_(std::make_unique<detail::EncoderState>(*model_)) {}

HfBpeTokenizer::~HfBpeTokenizer() = default;

std::unique_ptr<Tokenizer> HfBpeTokenizer::clone() const {
  return std::unique_ptr<Tokenizer>(new HfBpeTokenizer(model_));
}

int64_t HfBpeTokenizer::vocab_size() const { return model_->vocab_size; }
std::optional<int32_t> HfBpeTokenizer::eod_id() const { return model_->eod; }

std::string HfBpeTokenizer::describe() const {
  return lf::str("HuggingFaceTokenizer ", model_->path,
                 model_->spm ? " (SentencePiece-style BPE" : " (byte-level BPE",
                 model_->byte_fallback ? " with byte fallback, " : ", ", model_->vocab_size,
                 " ids, ", model_->merges.size(), " merges, ", model_->added.size(),
                 " added tokens", model_->nfc ? ", NFC" : "",
                 model_->ignore_merges ? ", ignore_merges" : "", ")");
}

std::optional<int32_t> HfBpeTokenizer::token_to_id(const std::string& token) const {
  for (const auto& t : model_->added)
    if (t.content == token) return t.id;
  auto it = model_->vocab.find(token);
  if (it == model_->vocab.end()) return std::nullopt;
  return it->second;
}

namespace {

// BPE on one pre-tokenized piece (raw bytes), HF's algorithm: repeatedly merge the adjacent pair
// of lowest rank (leftmost on ties), tracked in a heap with stale entries skipped.
void bpe_piece(const detail::BpeModel& m, detail::EncoderState& st, std::string_view piece,
               std::vector<int32_t>& out) {
  if (piece.empty()) return;
  if (m.ignore_merges) {
    auto it = m.raw_vocab.find(piece);
    if (it != m.raw_vocab.end()) {
      out.push_back(it->second);
      if (st.lens) st.lens->push_back(static_cast<int32_t>(piece.size()));
      return;
    }
  }
  auto hit = st.lens ? st.cache.end() : st.cache.find(piece);  // the cache holds ids, not lengths
  if (hit != st.cache.end()) {
    out.insert(out.end(), st.pool.begin() + hit->second.offset,
               st.pool.begin() + hit->second.offset + hit->second.count);
    return;
  }
  auto& sym = st.symbols;
  sym.clear();
  auto push = [&](int32_t id, int32_t len) {
    int32_t k = static_cast<int32_t>(sym.size());
    sym.push_back({id, k - 1, k + 1, len});
  };
  if (m.spm) {
    // HF's BPE on characters: a character missing from the vocabulary becomes its bytes' <0xXX>
    // tokens when all exist (byte_fallback), else the unk token, else nothing. As in HF, an unk
    // is held back until the next character found in the vocabulary (or the piece's end): byte
    // tokens met meanwhile come before it, and with fuse_unk the unknown characters on either
    // side of them fuse into that one unk ("a", "€" unknown, "é" as bytes, "€": a <C3> <A9> <unk>).
    int32_t pending_unk = 0;  // the held-back unk's length in bytes (0: none)
    auto flush_unk = [&] {
      if (pending_unk > 0) push(*m.unk, pending_unk);
      pending_unk = 0;
    };
    for (size_t i = 0; i < piece.size();) {
      const size_t b = i;
      uint32_t cp;
      if (!unicode::decode_utf8(piece, i, cp)) i = b + 1;
      const std::string_view ch = piece.substr(b, i - b);
      if (auto it = m.vocab.find(ch); it != m.vocab.end()) {
        flush_unk();
        push(it->second, static_cast<int32_t>(ch.size()));
        continue;
      }
      if (m.byte_fallback &&
          std::all_of(ch.begin(), ch.end(), [&](char c) { return m.fallback_id[static_cast<unsigned char>(c)] >= 0; })) {
        for (char c : ch) push(m.fallback_id[static_cast<unsigned char>(c)], 1);
        continue;
      }
      if (!m.unk) continue;
      if (pending_unk > 0 && !m.fuse_unk) flush_unk();
      pending_unk += static_cast<int32_t>(ch.size());
    }
    flush_unk();
  } else {
    for (unsigned char c : piece) {
      int32_t id = m.byte_id[c];
      if (id < 0) continue;  // HF drops characters missing from the vocabulary (no unk token)
      push(id, 1);
    }
  }
  if (!sym.empty()) sym.back().next = -1;
  auto& heap = st.heap;
  heap.clear();
  for (size_t k = 0; k + 1 < sym.size(); ++k)
    if (const auto* mg = m.find_merge(sym[k].id, sym[k + 1].id))
      heap.push_back({mg->rank, static_cast<int32_t>(k), mg->new_id});
  std::make_heap(heap.begin(), heap.end());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    auto top = heap.back();
    heap.pop_back();
    auto& cur = sym[static_cast<size_t>(top.pos)];
    if (cur.len == 0 || cur.next < 0) continue;
    auto& right = sym[static_cast<size_t>(cur.next)];
    const auto* mg = m.find_merge(cur.id, right.id);
    if (!mg || mg->new_id != top.new_id) continue;  // stale entry
    cur.id = top.new_id;
    cur.len += right.len;
    right.len = 0;
    cur.next = right.next;
    if (cur.next >= 0) sym[static_cast<size_t>(cur.next)].prev = top.pos;
    if (cur.prev >= 0)
      if (const auto* p = m.find_merge(sym[static_cast<size_t>(cur.prev)].id, cur.id)) {
        heap.push_back({p->rank, cur.prev, p->new_id});
        std::push_heap(heap.begin(), heap.end());
      }
    if (cur.next >= 0)
      if (const auto* n = m.find_merge(cur.id, sym[static_cast<size_t>(cur.next)].id)) {
        heap.push_back({n->rank, top.pos, n->new_id});
        std::push_heap(heap.begin(), heap.end());
      }
  }
  size_t first = out.size();
  for (size_t k = 0; k < sym.size(); ++k)
    if (sym[k].len > 0) {
      out.push_back(sym[k].id);
      if (st.lens) st.lens->push_back(sym[k].len);
    }
  if (piece.size() <= kMaxCachedWord && !st.lens) {
    if (st.cache.size() >= kMaxCacheEntries) st.cache.clear(), st.pool.clear();
    uint32_t off = static_cast<uint32_t>(st.pool.size());
    st.pool.insert(st.pool.end(), out.begin() + static_cast<std::ptrdiff_t>(first), out.end());
    st.cache.emplace(std::string(piece),
                     detail::EncoderState::Span{off, static_cast<uint32_t>(out.size() - first)});
  }
}

// Runs pre-tokenizer steps [step, end) on a piece, depth first, then BPE on each final piece.
void pre_tokenize(const detail::BpeModel& m, detail::EncoderState& st, size_t step,
                  std::string_view piece, std::vector<int32_t>& out) {
  if (piece.empty()) return;
  if (step == m.steps.size()) return bpe_piece(m, st, piece, out);
  const auto& s = m.steps[step];
  std::string prefixed;
  if (s.kind == detail::PreTokenizerStep::Kind::byte_level && s.add_prefix_space &&
      piece.front() != ' ') {
    prefixed.reserve(piece.size() + 1);
    prefixed = " ";
    prefixed.append(piece);
    piece = prefixed;
  }
  auto* matcher = st.matchers[step].get();
  if (!matcher) return pre_tokenize(m, st, step + 1, piece, out);
  // Isolated: every match is a piece, and so is every gap between matches; MergedWithPrevious:
  // a match ends the piece that runs up to it. An empty match (no real pattern has one) only
  // moves the search on by a character.
  size_t pos = 0, search = 0, b = 0, e = 0;
  while (search < piece.size() && matcher->find(piece, search, b, e)) {
    if (e == b) {
      search = b;
      uint32_t cp;
      if (!unicode::decode_utf8(piece, search, cp)) search = b + 1;
      continue;
    }
    if (s.merged_with_previous) {
      pre_tokenize(m, st, step + 1, piece.substr(pos, e - pos), out);
    } else {
      if (b > pos) pre_tokenize(m, st, step + 1, piece.substr(pos, b - pos), out);
      pre_tokenize(m, st, step + 1, piece.substr(b, e - b), out);
    }
    pos = search = e;
  }
  if (pos < piece.size()) pre_tokenize(m, st, step + 1, piece.substr(pos), out);
}

}  // namespace

namespace {

// Whether the character of text that ends at `end` (before) or starts at `begin` (after) matches
// the one-character class pattern (PCRE2 with UCP, as the tokenizers' other regexes). HF tests
// Rust's regex \w and \s, whose Unicode classes are spelled out below (PCRE2's \w has no marks).
bool char_before_is(const std::shared_ptr<const CompiledRegex>& re, std::string_view text, size_t end) {
  if (end == 0) return false;
  size_t b = end - 1;
  while (b > 0 && (static_cast<unsigned char>(text[b]) & 0xC0) == 0x80) --b;
  thread_local std::map<const CompiledRegex*, std::unique_ptr<RegexMatcher>> matchers;
  auto& mt = matchers[re.get()];
  if (!mt) mt = std::make_unique<RegexMatcher>(re);
  size_t mb = 0, me = 0;
  return mt->find(text.substr(b, end - b), 0, mb, me) && mb == 0 && me == end - b;
}
bool char_after_is(const std::shared_ptr<const CompiledRegex>& re, std::string_view text, size_t begin) {
  if (begin >= text.size()) return false;
  size_t e = begin;
  uint32_t cp = 0;
  unicode::decode_utf8(text, e, cp);  // e: the end of the character that starts at begin
  return char_before_is(re, text, e);
}
const std::shared_ptr<const CompiledRegex>& word_char() {
  static const auto re = std::make_shared<const CompiledRegex>("[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]", false,
                                                          "added tokens' single_word");
  return re;
}
const std::shared_ptr<const CompiledRegex>& space_char() {
  static const auto re = std::make_shared<const CompiledRegex>("\\p{White_Space}", false, "added tokens' lstrip/rstrip");
  return re;
}

// Splits text at added tokens (leftmost, then longest; the next search starts after a match) and
// hands each plain segment and each added token to the callbacks in order, as HF's
// AddedVocabulary: a single_word match with a word character next to it stays plain text; lstrip
// takes the whitespace before the match (not before the previous split) into the token, rstrip
// the whitespace after it.
template <class Plain, class Added>
void split_added(const detail::BpeModel& m, std::string_view text, Plain&& plain, Added&& added) {
  if (m.added.empty()) return plain(text, 0);
  size_t seg_begin = 0;
  for (size_t i = 0; i < text.size();) {
    if (!m.added_first_byte[static_cast<unsigned char>(text[i])]) {
      ++i;
      continue;
    }
    int32_t node = 0, best = -1;
    size_t best_end = 0;
    for (size_t j = i; j < text.size(); ++j) {
      const auto& next = m.trie[static_cast<size_t>(node)].next;
      unsigned char c = static_cast<unsigned char>(text[j]);
      auto it = std::find_if(next.begin(), next.end(), [c](const auto& e) { return e.first == c; });
      if (it == next.end()) break;
      node = it->second;
      if (m.trie[static_cast<size_t>(node)].token >= 0) best = m.trie[static_cast<size_t>(node)].token, best_end = j + 1;
    }
    if (best < 0) {
      ++i;
      continue;
    }
    const auto& t = m.added[static_cast<size_t>(best)];
    if (t.single_word &&
        (char_before_is(word_char(), text, i) || char_after_is(word_char(), text, best_end))) {
      i = best_end;
      continue;
    }
    size_t start = i, stop = best_end;
    if (t.lstrip)
      while (start > seg_begin && char_before_is(space_char(), text, start)) {
        --start;
        while (start > seg_begin && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
      }
    if (t.rstrip)
      while (stop < text.size() && char_after_is(space_char(), text, stop)) {
        uint32_t cp = 0;
        unicode::decode_utf8(text, stop, cp);
      }
    plain(text.substr(seg_begin, start - seg_begin), seg_begin);
    added(t.id, start, stop);
    i = seg_begin = stop;
  }
  plain(text.substr(seg_begin), seg_begin);
}

// The normalizer's Replace / Prepend / NFC steps in order (HF applies them to each segment
// between added tokens). With `align`, also HF's alignments: for each byte of the result, the
// range of segment bytes it comes from. A byte of the input maps to its whole character; Replace's
// content maps to the matched bytes; Prepend's content to the first character (HF aligns it
// there); NFC's recomposed characters by position in the decomposed text.
using Alignment = std::vector<std::pair<size_t, size_t>>;
std::string normalize(const detail::BpeModel& m, std::string_view seg, Alignment* align = nullptr) {
  std::string s(seg);
  if (align) {
    align->clear();
    for (size_t i = 0; i < seg.size();) {
      const size_t b = i;
      uint32_t cp;
      if (!unicode::decode_utf8(seg, i, cp)) i = b + 1;
      for (size_t k = b; k < i; ++k) align->emplace_back(b, i);
    }
  }
  for (const auto& n : m.norm) {
    Alignment next;
    std::string r;
    switch (n.kind) {
      case detail::NormalizeStep::Kind::nfc: {
        if (!align) {
          r = unicode::nfc(s);
          break;
        }
        std::vector<unicode::NfcPiece> pieces;
        r = unicode::nfc_aligned(s, pieces);
        next.resize(r.size());
        for (size_t p = 0; p < pieces.size(); ++p) {
          const auto& pc = pieces[p];
          const size_t out_end = p + 1 < pieces.size() ? pieces[p + 1].out_begin : r.size();
          if (pc.copied) {
            for (size_t k = pc.out_begin; k < out_end; ++k) next[k] = (*align)[pc.in_begin + (k - pc.out_begin)];
            continue;
          }
          // A recomposed run, aligned as HF's NFC aligns it: both sides decomposed (NFD) line up
          // code point for code point, and each output character takes the alignment of the input
          // character whose decomposition holds the code point its own starts at. "e" U+0301 ->
          // "é" on the "e"; "A" U+0301 U+0316 -> "Á" on the "A" and U+0316 on itself; the
          // reordered "q" U+0307 U+0323 -> "q" U+0323 U+0307 by position.
          std::vector<std::pair<size_t, size_t>> in;  // (NFD position where it starts, byte offset)
          size_t at = 0;
          for (size_t i = pc.in_begin; i < pc.in_end;) {
            const size_t b = i;
            uint32_t c = 0xFFFD;
            if (!unicode::decode_utf8(s, i, c)) i = b + 1;
            in.emplace_back(at, b);
            at += unicode::decomposition_length(c);
          }
          at = 0;
          for (size_t k = pc.out_begin; k < out_end;) {
            const size_t b = k;
            uint32_t c = 0xFFFD;
            if (!unicode::decode_utf8(r, k, c)) k = b + 1;
            auto it = std::upper_bound(in.begin(), in.end(), std::pair{at, SIZE_MAX}) - 1;  // in[0] starts at 0
            for (size_t x = b; x < k; ++x) next[x] = (*align)[it->second];
            at += unicode::decomposition_length(c);
          }
        }
        break;
      }
      case detail::NormalizeStep::Kind::prepend:
        if (s.empty()) continue;
        r = n.content + s;
        if (align) {
          next.assign(n.content.size(), align->front());
          next.insert(next.end(), align->begin(), align->end());
        }
        break;
      case detail::NormalizeStep::Kind::replace:  // the pattern is not empty (refused at load)
        for (size_t i = 0; i < s.size();) {
          if (s.compare(i, n.pattern.size(), n.pattern) == 0) {
            r += n.content;
            if (align)
              next.insert(next.end(), n.content.size(), {(*align)[i].first, (*align)[i + n.pattern.size() - 1].second});
            i += n.pattern.size();
          } else {
            r += s[i];
            if (align) next.push_back((*align)[i]);
            ++i;
          }
        }
        break;
    }
    s = std::move(r);
    if (align) *align = std::move(next);
  }
  return s;
}

void check_utf8(std::string_view text) {
  size_t bad = unicode::find_invalid_utf8(text);
  LF_CHECK(bad == std::string_view::npos, "tokenizer input is not valid UTF-8 at byte ", bad,
           " of ", text.size(), lf::hint("decode the input as UTF-8 before tokenizing"));
}

// HF matches an added token with `normalized: true` in the normalized text, against its content
// normalized the same way; LoongForge matches every added token in the raw text. The two agree
// when the normalizer leaves the content as it is; otherwise (Prepend's "▁", Replace's "▁" for a
// space, NFC) HF would match other places than ours, so such a file is refused.
void check_normalized_added_tokens(const detail::BpeModel& m) {
  for (const auto& t : m.added) {
    if (!t.normalized) continue;
    const std::string n = !m.norm.empty() ? normalize(m, t.content) : m.nfc ? unicode::nfc(t.content) : t.content;
    LF_CHECK(n == t.content, m.path, ": added token ", t.id, " '", t.content,
             "' has normalized: true and the normalizer turns it into '", n,
             "'; HF then matches it only in the normalized text, which is not supported",
             lf::hint("set \"normalized\": false on it in the added_tokens list if it is meant to match the text as "
                      "written (most special tokens are)"));
  }
}

}  // namespace

void HfBpeTokenizer::encode_into(std::string_view text, std::vector<int32_t>& out) {
  const auto& m = *model_;
  auto& st = *state_;
  check_utf8(text);
  split_added(
      m, text,
      [&](std::string_view seg, size_t) {
        if (seg.empty()) return;
        if (!m.norm.empty()) {
          const std::string normalized = normalize(m, seg);  // local: pieces point into it while used
          pre_tokenize(m, st, 0, normalized, out);
        } else if (m.nfc && !unicode::nfc_unchanged(seg)) {
          std::string normalized = unicode::nfc(seg);  // local: pieces point into it while used
          pre_tokenize(m, st, 0, normalized, out);
        } else {
          pre_tokenize(m, st, 0, seg, out);
        }
      },
      [&](int32_t id, size_t, size_t) { out.push_back(id); });
}

void HfBpeTokenizer::encode_with_offsets(std::string_view text, std::vector<int32_t>& out,
                                         std::vector<ByteSpan>& spans) {
  const auto& m = *model_;
  auto& st = *state_;
  check_utf8(text);
  if (m.spm || !m.norm.empty()) return encode_with_offsets_aligned(text, out, spans);
  std::vector<unicode::NfcPiece> pieces;
  split_added(
      m, text,
      [&](std::string_view seg, size_t seg_off) {
        if (seg.empty()) return;
        size_t first = out.size();
        bool normalized = m.nfc && !unicode::nfc_unchanged(seg);
        std::string norm;
        if (normalized) norm = unicode::nfc_aligned(seg, pieces);
        std::string_view enc = normalized ? std::string_view(norm) : seg;
        pre_tokenize(m, st, 0, enc, out);
        // Byte-level BPE: the tokens' bytes, back to back, are the (normalized) segment.
        size_t pos = 0;
        for (size_t k = first; k < out.size(); ++k) {
          size_t len = model_->id_bytes[static_cast<size_t>(out[k])].size();
          size_t b = pos, e = pos + len;
          pos = e;
          if (e > enc.size()) break;
          if (normalized) b = unicode::nfc_input_offset(pieces, b, false), e = unicode::nfc_input_offset(pieces, e, true);
          spans.push_back({seg_off + b, seg_off + e});
        }
        LF_CHECK(pos == enc.size(), "token offsets: the tokens of a ", enc.size(), "-byte segment hold ", pos,
                 " bytes in ", model_->path,
                 lf::hint("offsets need a byte-level BPE whose tokens spell the text exactly (no "
                          "ByteLevel add_prefix_space, every byte in the vocabulary)"));
      },
      [&](int32_t id, size_t b, size_t e) {
        out.push_back(id);
        spans.push_back({b, e});
      });
}

// SentencePiece-style (and any Replace / Prepend normalizer): each token's bytes in the normalized
// segment are its BPE symbol lengths back to back (HF's Word offsets: an unk held back past byte
// tokens is placed by its length where it lands, as HF places it), mapped to the input through the
// normalizer's alignments.
void HfBpeTokenizer::encode_with_offsets_aligned(std::string_view text, std::vector<int32_t>& out,
                                                 std::vector<ByteSpan>& spans) {
  const auto& m = *model_;
  auto& st = *state_;
  std::vector<int32_t> lens;
  Alignment align;
  split_added(
      m, text,
      [&](std::string_view seg, size_t seg_off) {
        if (seg.empty()) return;
        const std::string norm = normalize(m, seg, &align);
        const size_t first = out.size();
        lens.clear();
        st.lens = &lens;
        try {
          pre_tokenize(m, st, 0, norm, out);
        } catch (...) {
          st.lens = nullptr;
          throw;
        }
        st.lens = nullptr;
        LF_CHECK(lens.size() == out.size() - first, "token offsets: ", lens.size(), " lengths for ",
                 out.size() - first, " tokens in ", m.path);
        size_t total = 0;
        for (int32_t len : lens) total += static_cast<size_t>(len);
        LF_CHECK(total <= norm.size(), "token offsets: the tokens of a ", norm.size(), "-byte normalized segment hold ",
                 total, " bytes in ", m.path,
                 lf::hint("offsets need tokens that spell the normalized text (no ByteLevel add_prefix_space "
                          "after a Replace / Prepend normalizer)"));
        size_t pos = 0;
        for (int32_t len : lens) {
          const size_t b = pos, e = pos + static_cast<size_t>(len);
          pos = e;
          spans.push_back({seg_off + align[b].first, seg_off + align[e - 1].second});
        }
      },
      [&](int32_t id, size_t b, size_t e) {
        out.push_back(id);
        spans.push_back({b, e});
      });
}

std::optional<std::string> HfBpeTokenizer::added_token_content(int32_t id) const {
  for (const auto& t : model_->added)
    if (t.id == id) return t.content;
  return std::nullopt;
}

std::string HfBpeTokenizer::decode(std::span<const int32_t> ids) const {
  for (int32_t id : ids)
    LF_CHECK(id >= 0 && id < model_->vocab_size, "decode: token id ", id,
             " is outside the vocabulary [0, ", model_->vocab_size, ") of ", model_->path);
  const auto text_of = [&](int32_t id) -> const std::string& { return model_->id_bytes[static_cast<size_t>(id)]; };
  if (!model_->spm) {  // ByteLevel: the tokens' bytes, invalid UTF-8 as from_utf8_lossy
    std::string bytes;
    for (int32_t id : ids) bytes += text_of(id);
    return unicode::utf8_lossy(bytes);
  }
  // SentencePiece-style, HF's decoder chain: ByteFallback turns each run of <0xXX> tokens into its
  // text, or into one U+FFFD per byte when the run is not UTF-8; Strip then cuts leading spaces.
  std::vector<std::string> pieces;
  std::string run;
  size_t run_bytes = 0;
  const auto end_run = [&] {
    if (run_bytes == 0) return;
    if (unicode::utf8_lossy(run) == run) {
      pieces.push_back(run);
    } else {
      for (size_t k = 0; k < run_bytes; ++k) pieces.emplace_back("\xEF\xBF\xBD");
    }
    run.clear();
    run_bytes = 0;
  };
  for (int32_t id : ids) {
    if (model_->id_is_byte[static_cast<size_t>(id)]) {
      run += text_of(id);
      ++run_bytes;
    } else {
      end_run();
      pieces.push_back(text_of(id));
    }
  }
  end_run();
  const auto strip = [&](std::string& s) {
    size_t n = 0;
    while (n < static_cast<size_t>(model_->strip_start) && n < s.size() && s[n] == ' ') ++n;
    s.erase(0, n);
  };
  std::string out;
  for (auto& p : pieces) {
    if (model_->strip_each_token) strip(p);
    out += p;
  }
  if (!model_->strip_each_token) strip(out);
  return out;
}

std::vector<int32_t> HfBpeTokenizer::encode_with_special_tokens(std::string_view text,
                                                                std::optional<int64_t> max_length) {
  LF_CHECK(model_->template_error.empty(), model_->template_error,
           lf::hint("encode without the post-processor's special tokens, or add them yourself"));
  const auto special = static_cast<int64_t>(model_->template_prefix.size() + model_->template_suffix.size());
  LF_CHECK(!max_length || *max_length >= special, "a maximum length of ", max_length.value_or(0), " tokens is below the ",
           special, " special tokens the post-processor of ", model_->path, " adds",
           lf::hint("allow at least " + std::to_string(special) + " tokens"));
  std::vector<int32_t> out = model_->template_prefix;
  encode_into(text, out);
  if (max_length && static_cast<int64_t>(out.size()) + static_cast<int64_t>(model_->template_suffix.size()) > *max_length)
    out.resize(static_cast<size_t>(*max_length - static_cast<int64_t>(model_->template_suffix.size())));
  out.insert(out.end(), model_->template_suffix.begin(), model_->template_suffix.end());
  return out;
}

}  // namespace lf::data
