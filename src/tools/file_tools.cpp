// The file tools: read_file, write_file, edit_file (mcp-virtual-computer's arguments and messages,
// plus line ranges, images, base64 and sha256 guards), list_directory, search_files (ripgrep run
// inside the sandbox), file_info, move_file, copy_file, delete_file; and the files resource.
// Every path goes through the files resolver (files/resolver.hpp); every call is audited by the
// tool-call observer (tools.cpp).
#include <fnmatch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/text.hpp"
#include "base/time.hpp"
#include "base/users.hpp"
#include "files/content.hpp"
#include "files/image.hpp"
#include "files/resolver.hpp"
#include "jobs/jobs.hpp"
#include "sandbox/capture.hpp"
#include "tools/internal.hpp"

namespace nshpc::tools {

namespace {

using mcp::json;

constexpr std::size_t kDefaultLines = 2000;
constexpr std::size_t kMaxLines = 100000;
constexpr std::size_t kMaxLineChars = 2000;
constexpr std::size_t kSniffBytes = 8192;
constexpr std::uint64_t kMaxHashedBytes = 256ULL << 20;  // read_file hashes and counts files up to this
constexpr std::uint64_t kMaxEditBytes = 16ULL << 20;
constexpr std::size_t kMaxWriteBytes = 16U << 20;
constexpr std::uint64_t kMaxImageBytes = 32ULL << 20;
constexpr std::uint64_t kMaxResourceBytes = 32ULL << 20;
constexpr std::size_t kMaxWalkEntries = 50000;
constexpr std::size_t kSearchOutputCap = 16U << 20;
constexpr std::chrono::seconds kSearchTimeout{60};

// ---------------------------------------------------------------------------------------------
// The instance's files, as its sandbox sees them.

struct Scope {
  store::Instance inst;
  std::unique_ptr<files::InstanceFiles> files;
};

Scope open_scope(const ToolContext& ctx, const std::string& id) {
  Scope s{ctx.services.instances.store().get(id), nullptr};
  s.files = std::make_unique<files::InstanceFiles>(ctx.services.instances.file_view(s.inst));
  return s;
}

Scope open_scope(const ToolContext& ctx, const json& args) { return open_scope(ctx, instance_arg(ctx, args)); }

// A refused or failed file operation as the agent reads it: what was wrong, what to do.
[[noreturn]] void fail(const SysError& e, const std::string& shown) {
  switch (e.code()) {
    case ENOENT: throw UsageError(fmt::format("File does not exist: {} (list_directory shows what is there)", shown));
    case ENOTDIR: throw UsageError(fmt::format("A part of {} is not a directory", shown));
    case EISDIR: throw UsageError(fmt::format("{} is a directory (list_directory lists it)", shown));
    case ENXIO: throw UsageError(fmt::format("Path is not a regular file: {} (a FIFO, socket or device)", shown));
    case EPERM: throw UsageError(fmt::format("{} is not accessible: {}", shown, e.what()));
    case EACCES:
      // The file tools (and WebDAV) act as the instance's own user: its permissions apply.
      throw UsageError(fmt::format("{} is not accessible: {}. The file tools have the permissions a command in this "
                                   "instance has; a command can change them (chmod) if this is meant",
                                   shown, e.what()));
    case EXDEV:
    case ELOOP:
      throw UsageError(fmt::format("{} leads outside the instance's files through a link or '..', or has too many "
                                   "links; links are followed only inside the workspace and output folders",
                                   shown));
    case EEXIST: throw UsageError(fmt::format("{} already exists; set overwrite=true to replace it", shown));
    case ENOTEMPTY: throw UsageError(fmt::format("{} is a directory that is not empty", shown));
    case EBUSY: throw UsageError(fmt::format("{} is the folder itself; name something inside it", shown));
    case EROFS: throw UsageError(fmt::format("{} is read-only", shown));
    case ENOSPC:
    case EDQUOT: throw UsageError(fmt::format("No space left for {}: {}", shown, e.what()));
    case ENAMETOOLONG: throw UsageError(fmt::format("A path is too long: {}", e.what()));
    case ECANCELED: throw UsageError(fmt::format("Cancelled: {} (nothing of it was kept)", shown));
    default: throw UsageError(fmt::format("{}: {}", shown, e.what()));
  }
}

std::int64_t int_arg(const json& args, const char* name, std::int64_t fallback) {
  auto it = args.find(name);
  if (it == args.end() || it->is_null()) return fallback;
  if (it->is_number_integer()) return it->get<std::int64_t>();
  if (it->is_number_unsigned()) return static_cast<std::int64_t>(std::min<std::uint64_t>(it->get<std::uint64_t>(), INT64_MAX));
  throw UsageError(fmt::format("{} must be an integer", name));
}

bool bool_arg(const json& args, const char* name, bool fallback) {
  auto it = args.find(name);
  if (it == args.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) throw UsageError(fmt::format("{} must be true or false", name));
  return it->get<bool>();
}

std::vector<std::string> strings_arg(const json& args, const char* name) {
  std::vector<std::string> out;
  auto it = args.find(name);
  if (it == args.end() || it->is_null()) return out;
  if (it->is_string()) return {it->get<std::string>()};
  if (!it->is_array()) throw UsageError(fmt::format("{} must be a list of strings", name));
  for (const auto& v : *it) {
    if (!v.is_string()) throw UsageError(fmt::format("{} must be a list of strings", name));
    out.push_back(v.get<std::string>());
  }
  return out;
}

std::string path_arg(const json& args, const char* name = "path") {
  std::string p = string_arg(args, name);
  if (p.empty()) throw UsageError(fmt::format("{} is required: a path such as 'notes.txt' or '/workspace/notes.txt'", name));
  return p;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string mode_string(mode_t mode) { return fmt::format("{:04o}", mode & 07777); }

std::string iso_of(const struct timespec& ts) {
  return timeutil::iso_utc(std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::seconds(ts.tv_sec) +
                                                                      std::chrono::nanoseconds(ts.tv_nsec))));
}

std::string leaf_name(const std::string& rel) {
  const auto slash = rel.rfind('/');
  return slash == std::string::npos ? rel : rel.substr(slash + 1);
}

std::string human_bytes(std::uint64_t n) {
  if (n < 1024) return fmt::format("{} bytes", n);
  if (n < (1ULL << 20)) return fmt::format("{:.1f} KiB", static_cast<double>(n) / 1024);
  if (n < (1ULL << 30)) return fmt::format("{:.1f} MiB", static_cast<double>(n) / (1 << 20));
  return fmt::format("{:.2f} GiB", static_cast<double>(n) / (1ULL << 30));
}

// ---------------------------------------------------------------------------------------------
// read_file

json image_content(const files::Thumbnail& t) {
  return {{"type", "image"}, {"data", files::base64_encode(t.data)}, {"mimeType", t.mime}};
}

mcp::ToolResult read_image(const ToolContext& ctx, const files::Opened& o, const std::string& shown,
                           const files::Kind& kind) {
  const std::string data = read_whole(o, kMaxImageBytes, shown, "the image");
  const std::string sha = files::sha256_hex(data);
  const files::ImageLimits limits = image_limits(ctx.services.config);
  files::Thumbnail t;
  try {
    t = files::make_thumbnail(data, kind.mime, limits);
  } catch (const Error& e) {
    throw UsageError(fmt::format("{} ({}, {} bytes) could not be shown: {}", shown, kind.description, data.size(),
                                 e.what()));
  }
  std::string text = fmt::format("{}: {}, {}x{} pixels, {} bytes, sha256 {}", shown, kind.description,
                                 t.original_width, t.original_height, data.size(), sha);
  if (t.scaled) text += fmt::format(" (shown scaled to {}x{} as {})", t.width, t.height, t.mime);
  json structured = {{"path", shown},         {"type", "image"},          {"mime", kind.mime},
                     {"size_bytes", data.size()}, {"sha256", sha},           {"width", t.original_width},
                     {"height", t.original_height}, {"scaled", t.scaled},    {"shown_width", t.width},
                     {"shown_height", t.height}};
  mcp::ToolResult r = mcp::ToolResult::text(std::move(text), std::move(structured));
  r.content.push_back(image_content(t));
  return r;
}

mcp::ToolResult read_text(const ToolContext& ctx, const files::Opened& o, const std::string& shown,
                          const files::Kind& kind, std::size_t offset, std::size_t limit) {
  const std::size_t budget = output_budget(ctx.services.config);
  const std::uint64_t size = static_cast<std::uint64_t>(o.st.st_size);
  const bool whole = size <= kMaxHashedBytes;
  files::Sha256 hash;
  std::string raw, view;
  std::size_t line = 1;          // the line being read
  std::string current;           // the current line, when in the window (capped)
  std::size_t current_bytes = 0;
  std::size_t shown_lines = 0, cut_lines = 0;
  std::optional<std::size_t> next_offset;
  bool window_done = false, raw_cut = false;
  std::uint64_t crlf = 0, lf = 0;
  char last = '\n';
  const std::size_t current_cap = budget + 8;

  auto finish_line = [&](bool has_newline) {
    if (line >= offset && !window_done) {
      if (shown_lines >= limit) {
        window_done = true;
        next_offset = line;
      } else {
        std::string body = current;
        const bool cr = !body.empty() && body.back() == '\r' && has_newline;
        std::string visible = cr ? body.substr(0, body.size() - 1) : body;
        visible = text::sanitize_utf8(visible);
        std::string shown_line = visible;
        if (text::utf8_length(visible) > kMaxLineChars || current_bytes > current.size()) {
          shown_line = visible.substr(0, text::utf8_prefix_bytes(visible, kMaxLineChars)) +
                       fmt::format(" … [line cut: {} bytes in all]", current_bytes - (cr ? 1 : 0));
          ++cut_lines;
        }
        std::string numbered = fmt::format("{:>6}\t{}\n", line, shown_line);
        std::string raw_line = text::sanitize_utf8(body) + (has_newline ? "\n" : "");
        if (shown_lines > 0 && (view.size() + numbered.size() > budget || raw.size() + raw_line.size() > budget)) {
          window_done = true;
          next_offset = line;
        } else {
          if (raw_line.size() > budget) {
            raw_line = raw_line.substr(0, text::utf8_prefix_bytes(raw_line, budget));
            raw_cut = true;
          }
          if (current_bytes > current.size()) raw_cut = true;
          view += numbered;
          raw += raw_line;
          ++shown_lines;
        }
      }
    }
    current.clear();
    current_bytes = 0;
    ++line;
  };

  char buf[1 << 16];
  off_t at = 0;
  for (;;) {
    if (window_done && !whole) break;
    const ssize_t n = ::pread(o.fd.get(), buf, sizeof buf, at);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail(SysError(errno, "read", shown), shown);
    }
    if (n == 0) break;
    at += n;
    std::string_view chunk(buf, static_cast<std::size_t>(n));
    if (whole) hash.update(chunk);
    std::size_t start = 0;
    while (start < chunk.size()) {
      const auto nl = chunk.find('\n', start);
      const std::size_t end = nl == std::string_view::npos ? chunk.size() : nl;
      const std::size_t len = end - start;
      if (line >= offset && !window_done && current.size() < current_cap)
        current.append(chunk.substr(start, std::min(len, current_cap - current.size())));
      current_bytes += len;
      if (nl == std::string_view::npos) break;
      if (end > start ? chunk[end - 1] == '\r' : (current_bytes > 0 && last == '\r')) ++crlf; else ++lf;
      finish_line(true);
      start = nl + 1;
    }
    last = chunk.back();
  }
  const bool trailing = current_bytes > 0;
  if (trailing && !(window_done && !whole)) finish_line(false);
  std::optional<std::size_t> total;
  if (whole) total = line - 1;

  // Which lines `content` holds (offset, lines; total_lines when counted) and whether that is the
  // whole file; long_lines_cut: lines cut in the text (content has them, unless content_cut).
  json structured = {{"path", shown},   {"type", "text"},   {"mime", kind.mime},       {"content", raw},
                     {"offset", offset}, {"lines", shown_lines}, {"size_bytes", size}, {"eol", crlf > lf ? "crlf" : "lf"},
                     {"complete", offset == 1 && !next_offset && !raw_cut}, {"long_lines_cut", cut_lines}};
  if (raw_cut) structured["content_cut"] = true;
  if (total) structured["total_lines"] = *total;
  if (whole) structured["sha256"] = hash.hex();
  if (next_offset) structured["next_offset"] = *next_offset;
  std::string head;
  if (shown_lines == 0) {
    head = total ? fmt::format("{}: no lines from line {} on (the file has {} lines, {})", shown, offset, *total,
                               human_bytes(size))
                 : fmt::format("{}: no lines from line {} on", shown, offset);
  } else {
    head = fmt::format("{}: lines {}-{}", shown, offset, offset + shown_lines - 1);
    head += total ? fmt::format(" of {} ({}", *total, human_bytes(size)) : fmt::format(" ({}", human_bytes(size));
    head += whole ? fmt::format(", sha256 {})", structured["sha256"].get<std::string>()) : ", too large to hash)";
  }
  std::string text = head + "\n" + view;
  if (cut_lines) text += fmt::format("[{} long line(s) cut at {} characters]\n", cut_lines, kMaxLineChars);
  if (next_offset)
    text += fmt::format("[more: read_file with offset {} for the next lines{}]", *next_offset,
                        total ? fmt::format(" ({} left)", *total - *next_offset + 1) : "");
  return mcp::ToolResult::text(std::move(text), std::move(structured));
}

mcp::ToolResult read_file(const ToolContext& ctx, const json& args) {
  Scope s = open_scope(ctx, args);
  const files::Location at = s.files->resolve(path_arg(args), files::InstanceFiles::Follow::last);
  const std::string shown = at.shown();
  const std::int64_t offset = int_arg(args, "offset", 1);
  const std::int64_t limit = int_arg(args, "limit", static_cast<std::int64_t>(kDefaultLines));
  if (offset < 1) throw UsageError("offset is a line number and starts at 1");
  if (limit < 1 || static_cast<std::size_t>(limit) > kMaxLines)
    throw UsageError(fmt::format("limit must be between 1 and {} lines", kMaxLines));
  files::Opened o;
  try {
    o = files::open_read(at);
  } catch (const SysError& e) {
    fail(e, shown);
  }
  if (o.is_dir()) throw UsageError(fmt::format("{} is a directory (list_directory lists it)", shown));
  const std::string head = pread_some(o.fd.get(), kSniffBytes);
  const files::Kind kind = files::sniff(head, leaf_name(at.rel));
  if (kind.cls == files::Kind::Class::image) return read_image(ctx, o, shown, kind);
  if (kind.cls == files::Kind::Class::binary) {
    const std::uint64_t size = static_cast<std::uint64_t>(o.st.st_size);
    json structured = {{"path", shown}, {"type", "binary"}, {"mime", kind.mime}, {"description", kind.description},
                       {"size_bytes", size}};
    std::string sha;
    if (size <= kMaxHashedBytes) {
      files::Sha256 h;
      char buf[1 << 16];
      off_t at_byte = 0;
      for (ssize_t n; (n = ::pread(o.fd.get(), buf, sizeof buf, at_byte)) > 0; at_byte += n)
        h.update(std::string_view(buf, static_cast<std::size_t>(n)));
      sha = h.hex();
      structured["sha256"] = sha;
    }
    return mcp::ToolResult::text(
        fmt::format("{} is a binary file ({}, {}, {}{}); not shown as text. A command in the instance can "
                    "inspect it (file, xxd, python).",
                    shown, kind.description, kind.mime, human_bytes(size), sha.empty() ? "" : ", sha256 " + sha),
        std::move(structured));
  }
  return read_text(ctx, o, shown, kind, static_cast<std::size_t>(offset), static_cast<std::size_t>(limit));
}

// ---------------------------------------------------------------------------------------------
// write_file

// The current content's sha256 must be `expected` (a guard against overwriting a change).
void check_guard(files::PendingFile& pending, const std::string& expected, const std::string& shown,
                 const char* message) {
  auto current = pending.open_current();
  if (!current) throw UsageError(fmt::format("{}: {} no longer exists", message, shown));
  files::Sha256 h;
  char buf[1 << 16];
  for (ssize_t n; (n = ::read(current->get(), buf, sizeof buf)) > 0;) h.update(std::string_view(buf, static_cast<std::size_t>(n)));
  const std::string now = h.hex();
  if (now != lower(expected))
    throw UsageError(fmt::format("{}: {} has sha256 {} now, not {}; read it again and redo the change", message,
                                 shown, now, expected));
}

mcp::ToolResult write_file(const ToolContext& ctx, const json& args) {
  Scope s = open_scope(ctx, args);
  const files::Location at = s.files->resolve(path_arg(args));
  const std::string shown = at.shown();
  auto content_it = args.find("content");
  if (content_it == args.end() || !content_it->is_string()) throw UsageError("content is required (a string)");
  const std::string encoding = string_arg(args, "encoding").empty() ? "text" : string_arg(args, "encoding");
  std::string data;
  if (encoding == "base64") {
    auto decoded = files::base64_decode(content_it->get_ref<const std::string&>());
    if (!decoded) throw UsageError("content is not valid base64 (encoding is 'base64')");
    data = std::move(*decoded);
  } else if (encoding == "text") {
    data = content_it->get<std::string>();
  } else {
    throw UsageError("encoding must be 'text' or 'base64'");
  }
  if (data.size() > kMaxWriteBytes)
    throw UsageError(fmt::format("content is {} bytes; the write_file limit is {} bytes. Write the file in parts with "
                                 "a command, or copy it in through WebDAV",
                                 data.size(), kMaxWriteBytes));
  const bool parents = bool_arg(args, "create_parent_directories", true);
  const std::string expected = string_arg(args, "expected_sha256");
  const auto slash = at.rel.rfind('/');
  const files::Location parent{at.root, slash == std::string::npos ? std::string() : at.rel.substr(0, slash)};
  bool parent_existed = true, existed = true;
  try {
    files::stat_at(parent, true);
  } catch (const SysError& e) {
    if (e.code() != ENOENT) fail(e, parent.shown());
    parent_existed = false;
    if (!parents)
      throw UsageError(fmt::format("Parent directory does not exist: {} (set create_parent_directories=true)",
                                   parent.shown()));
  }
  try {
    files::stat_at(at, false);
  } catch (const SysError&) {
    existed = false;
  }
  struct stat st {};
  try {
    files::WriteOptions options;
    options.create_parents = parents;
    auto pending = files::begin_write(at, options);
    pending->write(data);
    if (!expected.empty()) check_guard(*pending, expected, shown, "Not written");
    st = pending->commit();
  } catch (const SysError& e) {
    fail(e, shown);
  }
  const std::string sha = files::sha256_hex(data);
  json structured = {{"path", shown},          {"size_bytes", data.size()}, {"sha256", sha},
                     {"created", !existed},    {"created_parent_directories", !parent_existed},
                     {"mode", mode_string(st.st_mode)}};
  return mcp::ToolResult::text(fmt::format("{} {} ({} bytes, mode {}, sha256 {}){}", existed ? "Replaced" : "Created",
                                           shown, data.size(), mode_string(st.st_mode), sha,
                                           parent_existed ? "" : "; created its parent directories"),
                               std::move(structured));
}

// ---------------------------------------------------------------------------------------------
// edit_file

std::size_t count_matches(const std::string& hay, const std::string& needle) { return text::find_all(hay, needle).size(); }

std::size_t line_of(const std::string& s, std::size_t pos) {
  return 1 + static_cast<std::size_t>(std::count(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(pos), '\n'));
}

// Lines [first, last] of `s`, numbered as read_file shows them (at most `max` lines).
std::string numbered_lines(const std::string& s, std::size_t first, std::size_t last, std::size_t max = 12) {
  std::string out;
  std::size_t line = 1, start = 0;
  while (start <= s.size() && line <= last && line < first + max) {
    auto nl = s.find('\n', start);
    const std::size_t end = nl == std::string::npos ? s.size() : nl;
    if (line >= first) {
      std::string body = s.substr(start, end - start);
      if (!body.empty() && body.back() == '\r') body.pop_back();
      body = text::sanitize_utf8(body);
      if (text::utf8_length(body) > 300) body = body.substr(0, text::utf8_prefix_bytes(body, 300)) + " …";
      out += fmt::format("{:>6}\t{}\n", line, body);
    }
    if (nl == std::string::npos) break;
    start = nl + 1;
    ++line;
  }
  return out;
}

// Where `needle` would match if whitespace did not count (runs of blanks, tabs and line ends as
// one space; leading and trailing whitespace ignored), as a byte range of `hay`.
std::optional<std::pair<std::size_t, std::size_t>> whitespace_near_miss(const std::string& hay, const std::string& needle) {
  auto squeeze = [](const std::string& s, std::vector<std::size_t>* map) {
    std::string out;
    bool space = false;
    for (std::size_t i = 0; i < s.size(); ++i) {
      const char c = s[i];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
        space = true;
        continue;
      }
      if (space && !out.empty()) {
        out += ' ';
        if (map) map->push_back(i);
      }
      space = false;
      out += c;
      if (map) map->push_back(i);
    }
    return out;
  };
  std::vector<std::size_t> map;
  const std::string h = squeeze(hay, &map);
  const std::string n = squeeze(needle, nullptr);
  if (n.empty()) return std::nullopt;
  const auto pos = h.find(n);
  if (pos == std::string::npos) return std::nullopt;
  return std::make_pair(map[pos], map[pos + n.size() - 1] + 1);
}

std::string no_match_hint(const std::string& content, const std::string& old_text) {
  if (auto near = whitespace_near_miss(content, old_text)) {
    const std::size_t first = line_of(content, near->first), last = line_of(content, near->second - 1);
    return fmt::format(" The nearest match differs only in whitespace (indentation, spaces or line ends), at "
                       "line{} {}{}; copy the text exactly as it is there:\n{}",
                       first == last ? "" : "s", first, first == last ? "" : fmt::format("-{}", last),
                       numbered_lines(content, first, last));
  }
  // The first line of old_text, alone, ignoring leading and trailing whitespace.
  std::string_view first_line = old_text;
  while (!first_line.empty() && text::trim(first_line.substr(0, first_line.find('\n'))).empty() &&
         first_line.find('\n') != std::string_view::npos)
    first_line.remove_prefix(first_line.find('\n') + 1);
  first_line = text::trim(first_line.substr(0, first_line.find('\n')));
  if (first_line.size() >= 4) {
    const auto pos = content.find(first_line);
    if (pos != std::string::npos) {
      const std::size_t l = line_of(content, pos);
      return fmt::format(" Its first line occurs at line {}; the lines after it differ. There:\n{}", l,
                         numbered_lines(content, l, l + 5));
    }
  }
  return " Nothing similar was found either; read_file the region and copy the text exactly.";
}

mcp::ToolResult edit_file(const ToolContext& ctx, const json& args) {
  Scope s = open_scope(ctx, args);
  const files::Location at = s.files->resolve(path_arg(args));
  const std::string shown = at.shown();
  auto old_it = args.find("old_text");
  auto new_it = args.find("new_text");
  if (old_it == args.end() || !old_it->is_string() || old_it->get_ref<const std::string&>().empty())
    throw UsageError("old_text must not be empty");
  if (new_it == args.end() || !new_it->is_string()) throw UsageError("new_text is required (a string; \"\" deletes)");
  std::string old_text = old_it->get<std::string>(), new_text = new_it->get<std::string>();
  if (old_text == new_text) throw UsageError("old_text and new_text are the same; there is nothing to change");
  const bool replace_all = bool_arg(args, "replace_all", false);
  const std::string expected = string_arg(args, "expected_sha256");
  files::Opened o;
  try {
    o = files::open_read(at);
  } catch (const SysError& e) {
    fail(e, shown);
  }
  if (o.is_dir()) throw UsageError(fmt::format("Path is not a regular file: {} is a directory", shown));
  const std::string content = read_whole(o, kMaxEditBytes, shown, "the edit_file");
  const std::string before_sha = files::sha256_hex(content);
  if (!expected.empty() && lower(expected) != before_sha)
    throw UsageError(fmt::format("File changed since it was read: {} has sha256 {} now, not {}; read it again",
                                 shown, before_sha, expected));
  // A file with CRLF line ends keeps them: old_text and new_text given with \n match and write \r\n.
  const std::size_t crlf = count_matches(content, "\r\n");
  const std::size_t lf = static_cast<std::size_t>(std::count(content.begin(), content.end(), '\n')) - crlf;
  if (crlf > lf && old_text.find('\r') == std::string::npos) {
    auto to_crlf = [](const std::string& t) {
      std::string out;
      for (char c : t) {
        if (c == '\n') out += '\r';
        out += c;
      }
      return out;
    };
    old_text = to_crlf(old_text);
    new_text = to_crlf(new_text);
  }
  const std::vector<std::size_t> positions = text::find_all(content, old_text);
  const std::size_t matches = positions.size();
  if (matches == 0) throw UsageError(fmt::format("old_text was not found in {}.{}", shown, no_match_hint(content, old_text)));
  if (matches > 1 && !replace_all) {
    std::string lines;
    for (std::size_t i = 0; i < positions.size() && i < 10; ++i)
      lines += (i ? ", " : "") + std::to_string(line_of(content, positions[i]));
    throw UsageError(fmt::format("old_text occurs {} times in {}; provide more surrounding text or set replace_all=true "
                                 "(at lines {}{})",
                                 matches, shown, lines, matches > 10 ? ", …" : ""));
  }
  const std::string updated = text::replace_at(content, positions, old_text.size(), new_text);
  try {
    auto pending = files::begin_write(at, {});
    pending->write(updated);
    check_guard(*pending, before_sha, shown, "File changed before edit could be saved");
    pending->commit();
  } catch (const SysError& e) {
    fail(e, shown);
  }
  const std::size_t first_line = line_of(updated, positions.front() + 0);
  const std::size_t new_lines = static_cast<std::size_t>(std::count(new_text.begin(), new_text.end(), '\n'));
  const std::string sha = files::sha256_hex(updated);
  json structured = {{"path", shown},       {"replacements", matches},     {"sha256", sha},
                     {"size_bytes", updated.size()}, {"first_line", first_line}};
  std::string text = fmt::format("Replaced {} occurrence{} in {} (first at line {}); sha256 {}\n", matches,
                                 matches == 1 ? "" : "s", shown, first_line, sha);
  const std::size_t from_line = first_line > 2 ? first_line - 2 : 1;
  text += numbered_lines(updated, from_line, first_line + new_lines + 2);
  return mcp::ToolResult::text(std::move(text), std::move(structured));
}

// ---------------------------------------------------------------------------------------------
// list_directory

bool glob_match(const std::vector<std::string>& globs, const std::string& name, const std::string& rel) {
  return std::any_of(globs.begin(), globs.end(), [&](const std::string& g) {
    const bool by_path = g.find('/') != std::string::npos;
    return ::fnmatch(g.c_str(), (by_path ? rel : name).c_str(), by_path ? FNM_PATHNAME : 0) == 0;
  });
}

mcp::ToolResult list_directory(const ToolContext& ctx, const json& args) {
  Scope s = open_scope(ctx, args);
  const std::string given = string_arg(args, "path").empty() ? "." : string_arg(args, "path");
  const files::Location top = s.files->resolve(given, files::InstanceFiles::Follow::last);
  const std::string shown = top.shown();
  const std::int64_t depth = int_arg(args, "depth", 1);
  const std::int64_t offset = int_arg(args, "offset", 0);
  const std::int64_t limit = int_arg(args, "limit", 200);
  if (depth < 1 || depth > 20) throw UsageError("depth must be between 1 and 20");
  if (offset < 0) throw UsageError("offset must be 0 or more");
  if (limit < 1 || limit > 2000) throw UsageError("limit must be between 1 and 2000");
  const auto include = strings_arg(args, "include");
  const auto exclude = strings_arg(args, "exclude");
  std::set<std::string> types;
  for (const auto& t : strings_arg(args, "types")) {
    if (t != "file" && t != "directory" && t != "symlink" && t != "other")
      throw UsageError("types may hold 'file', 'directory', 'symlink' and 'other'");
    types.insert(t);
  }
  struct Found {
    std::string rel;  // below the listed folder
    files::Entry e;
  };
  std::vector<Found> found;
  std::deque<std::pair<std::string, int>> pending{{"", 1}};
  std::size_t visited = 0;
  bool walk_cut = false;
  while (!pending.empty()) {
    auto [rel, level] = pending.front();
    pending.pop_front();
    std::vector<files::Entry> entries;
    const files::Location here{top.root, rel.empty() ? top.rel : (top.rel.empty() ? rel : top.rel + "/" + rel)};
    try {
      entries = files::list_dir(here, kMaxWalkEntries - std::min(visited, kMaxWalkEntries) + 1);
    } catch (const SysError& e) {
      if (rel.empty()) fail(e, shown);
      continue;  // a folder that went away or became something else meanwhile
    }
    for (auto& e : entries) {
      if (++visited > kMaxWalkEntries) {
        walk_cut = true;
        break;
      }
      const std::string child = rel.empty() ? e.name : rel + "/" + e.name;
      if (e.type == files::EntryType::directory && level < depth && !glob_match(exclude, e.name, child))
        pending.emplace_back(child, level + 1);
      found.push_back({child, std::move(e)});
    }
    if (walk_cut) break;
  }
  std::vector<const Found*> kept;
  for (const auto& f : found) {
    if (!types.empty() && !types.count(files::to_string(f.e.type))) continue;
    if (!include.empty() && !glob_match(include, f.e.name, f.rel)) continue;
    if (glob_match(exclude, f.e.name, f.rel)) continue;
    kept.push_back(&f);
  }
  std::sort(kept.begin(), kept.end(), [](const Found* a, const Found* b) { return a->rel < b->rel; });
  const std::size_t total = kept.size();
  const std::size_t first = std::min<std::size_t>(static_cast<std::size_t>(offset), total);
  const std::size_t budget = output_budget(ctx.services.config);
  json entries = json::array();
  std::string text;
  std::size_t i = first;
  for (; i < total && i < first + static_cast<std::size_t>(limit); ++i) {
    const Found& f = *kept[i];
    const std::string path = shown == "/" ? "/" + f.rel : shown + "/" + f.rel;
    json entry = {{"path", path},        {"name", f.e.name},          {"type", files::to_string(f.e.type)},
                  {"size_bytes", f.e.size}, {"mode", mode_string(f.e.mode)}};
    std::string line;
    const char* mark = f.e.type == files::EntryType::directory ? "/" : "";
    if (f.e.type == files::EntryType::symlink) {
      try {
        const std::string target = files::read_link({top.root, top.rel.empty() ? f.rel : top.rel + "/" + f.rel});
        entry["link_target"] = text::sanitize_utf8(target);
        line = fmt::format("{:>10}  {} -> {}\n", "link", text::sanitize_utf8(f.rel), text::sanitize_utf8(target));
      } catch (const SysError&) {
      }
    }
    if (line.empty())
      line = fmt::format("{:>10}  {}{}\n",
                         f.e.type == files::EntryType::directory ? "dir"
                         : f.e.type == files::EntryType::other   ? "other"
                                                                 : human_bytes(f.e.size),
                         text::sanitize_utf8(f.rel), mark);
    if (text.size() + line.size() > budget) break;
    entry["name"] = text::sanitize_utf8(f.e.name);
    entry["path"] = text::sanitize_utf8(path);
    text += line;
    entries.push_back(std::move(entry));
  }
  json structured = {{"path", shown}, {"entries", entries}, {"total", total}, {"offset", first}};
  std::string head = fmt::format("{}: {} entr{}{}", shown, total, total == 1 ? "y" : "ies",
                                 total ? fmt::format(", showing {}-{}", first + 1, i) : "");
  if (i < total) {
    structured["next_offset"] = i;
    head += fmt::format(" (more: offset {})", i);
  }
  if (walk_cut) {
    structured["walk_cut"] = true;
    head += fmt::format("; the walk stopped after {} entries: list a smaller folder or lower depth", kMaxWalkEntries);
  }
  return mcp::ToolResult::text(head + "\n" + text, std::move(structured));
}

// ---------------------------------------------------------------------------------------------
// search_files: ripgrep inside the sandbox

struct Hit {
  std::string path;
  std::size_t line = 0;
  std::string text;
  bool match = false;
  std::size_t owner = 0;  // the match (index among matches) this line belongs to
};

mcp::ToolResult search_files(const ToolContext& ctx, const json& args, mcp::RequestContext& rc) {
  const config::Config& cfg = ctx.services.config;
  const std::string id = instance_arg(ctx, args);
  const store::Instance inst = ctx.services.instances.store().get(id);
  const std::string pattern = string_arg(args, "pattern");
  const auto globs = strings_arg(args, "glob");
  const std::string path = string_arg(args, "path").empty() ? "." : string_arg(args, "path");
  std::string mode = string_arg(args, "mode");
  if (mode.empty()) mode = pattern.empty() ? "files" : "lines";
  if (mode != "files" && mode != "lines" && mode != "counts") throw UsageError("mode must be 'files', 'lines' or 'counts'");
  if (mode != "files" && pattern.empty()) throw UsageError(fmt::format("mode '{}' needs a pattern", mode));
  const std::int64_t context = int_arg(args, "context", 0);
  const std::int64_t offset = int_arg(args, "offset", 0);
  const std::int64_t limit = int_arg(args, "limit", 100);
  if (context < 0 || context > 20) throw UsageError("context must be between 0 and 20 lines");
  if (offset < 0) throw UsageError("offset must be 0 or more");
  if (limit < 1 || limit > 1000) throw UsageError("limit must be between 1 and 1000");
  const bool icase = bool_arg(args, "case_insensitive", false);
  const bool hidden = bool_arg(args, "include_hidden", false);

  std::vector<std::string> argv = {"rg", "--no-config", "--sort=path", "--no-messages"};
  if (icase) argv.push_back("--ignore-case");
  if (hidden) {
    argv.push_back("--hidden");
    argv.push_back("--no-ignore");
  }
  for (const auto& g : globs) argv.push_back("--glob=" + g);
  if (mode == "files" && pattern.empty()) {
    argv.push_back("--files");
    argv.push_back("--null");
  } else if (mode == "files") {
    argv.push_back("--files-with-matches");
    argv.push_back("--null");
  } else if (mode == "counts") {
    argv.push_back("--count-matches");
    argv.push_back("--with-filename");
    argv.push_back("--null");
  } else {
    argv.push_back("--json");
    argv.push_back("--max-columns=2000");
    argv.push_back("--max-columns-preview");
    if (context > 0) argv.push_back(fmt::format("--context={}", context));
  }
  if (!pattern.empty()) argv.push_back("--regexp=" + pattern);
  argv.push_back("--");
  if (!string_arg(args, "path").empty()) argv.push_back(path);  // else the workspace, paths shown without "./"

  sandbox::ExecSpec spec = ctx.services.instances.command(inst, instances::Service::Command::search, argv);
  sandbox::CaptureOptions options;
  options.output_cap = kSearchOutputCap;
  options.timeout = kSearchTimeout;
  options.cancelled = [&rc] { return rc.cancelled(); };
  sandbox::CaptureResult o =
      ctx.services.instances.run_captured(inst, std::move(spec), std::move(options), "a search of its files");
  if (o.ending == sandbox::Ending::cancelled) return mcp::ToolResult::error("cancelled");
  if (!o.status.started || o.status.exit_code == 127)
    throw UsageError(fmt::format("ripgrep (rg) could not run in the instance's sandbox: {}",
                                 text::truncate_utf8(text::sanitize_utf8(o.err), 500)));
  if (o.status.exit_code == 2 && o.out.empty())
    throw UsageError(fmt::format("rg failed: {}", text::truncate_utf8(text::sanitize_utf8(o.err), 1000)));
  std::string partial;
  if (o.ending == sandbox::Ending::timed_out)
    partial = fmt::format("the search was stopped after {} s; results are incomplete: narrow path, glob or pattern",
                          kSearchTimeout.count());
  if (o.ending == sandbox::Ending::output_limit)
    partial = fmt::format("the search found more than {} of results and was stopped; results are incomplete: narrow "
                          "path, glob or pattern",
                          human_bytes(kSearchOutputCap));

  const std::size_t budget = output_budget(cfg);
  const std::size_t first = static_cast<std::size_t>(offset);
  const std::size_t last = first + static_cast<std::size_t>(limit);
  json items = json::array();
  std::string text;
  std::size_t total = 0, shown_items = 0;
  std::optional<std::size_t> next;

  if (mode != "lines") {
    // NUL-separated paths; counts: path NUL count LF.
    std::vector<std::pair<std::string, std::int64_t>> rows;
    std::size_t start = 0;
    while (start < o.out.size()) {
      const auto nul = o.out.find('\0', start);
      if (nul == std::string::npos) break;
      std::string p = o.out.substr(start, nul - start);
      start = nul + 1;
      std::int64_t count = -1;
      if (mode == "counts") {
        const auto nl = o.out.find('\n', start);
        count = std::atoll(o.out.substr(start, nl - start).c_str());
        start = nl == std::string::npos ? o.out.size() : nl + 1;
      } else if (start < o.out.size() && o.out[start] == '\n') {
        ++start;
      }
      rows.emplace_back(text::sanitize_utf8(p), count);
    }
    total = rows.size();
    for (std::size_t i = first; i < rows.size() && i < last; ++i) {
      const std::string line = rows[i].second >= 0 ? fmt::format("{}: {}\n", rows[i].first, rows[i].second)
                                                    : rows[i].first + "\n";
      if (text.size() + line.size() > budget) {
        next = i;
        break;
      }
      text += line;
      json item = {{"path", rows[i].first}};
      if (rows[i].second >= 0) item["count"] = rows[i].second;
      items.push_back(std::move(item));
      ++shown_items;
    }
    if (!next && first + shown_items < total) next = first + shown_items;
  } else {
    std::vector<Hit> hits;
    std::size_t start = 0, matches = 0;
    while (start < o.out.size()) {
      auto nl = o.out.find('\n', start);
      if (nl == std::string::npos) nl = o.out.size();
      json ev = parse_json_or_discarded(std::string_view(o.out).substr(start, nl - start));
      start = nl + 1;
      if (ev.is_discarded() || !ev.is_object()) continue;
      const std::string type = ev.value("type", "");
      if (type != "match" && type != "context") continue;
      const json& d = ev["data"];
      Hit h;
      h.match = type == "match";
      h.path = d.contains("path") && d["path"].contains("text") ? d["path"]["text"].get<std::string>() : "(binary path)";
      h.line = d.value("line_number", std::size_t{0});
      if (d.contains("lines") && d["lines"].contains("text")) h.text = d["lines"]["text"].get<std::string>();
      while (!h.text.empty() && (h.text.back() == '\n' || h.text.back() == '\r')) h.text.pop_back();
      if (h.match) h.owner = matches++;
      hits.push_back(std::move(h));
    }
    total = matches;
    // Context lines belong to the nearest match of the same file (the one before, when close enough).
    for (std::size_t i = 0; i < hits.size(); ++i) {
      if (hits[i].match) continue;
      std::optional<std::size_t> before, after;
      for (std::size_t j = i; j-- > 0;)
        if (hits[j].match) {
          if (hits[j].path == hits[i].path && hits[i].line - hits[j].line <= static_cast<std::size_t>(context))
            before = hits[j].owner;
          break;
        }
      for (std::size_t j = i + 1; j < hits.size(); ++j)
        if (hits[j].match) {
          if (hits[j].path == hits[i].path) after = hits[j].owner;
          break;
        }
      hits[i].owner = before ? *before : after ? *after : 0;
    }
    std::string previous_path;
    std::size_t previous_line = 0;
    for (const Hit& h : hits) {
      if (h.owner < first || h.owner >= last) continue;
      if (next && h.owner >= *next) break;
      std::string body = text::sanitize_utf8(h.text);
      const std::string sep = h.match ? ":" : "-";
      std::string line;
      if (!previous_path.empty() && (h.path != previous_path || h.line > previous_line + 1)) line += "--\n";
      line += fmt::format("{}{}{}{}{}\n", text::sanitize_utf8(h.path), sep, h.line, sep, body);
      if (text.size() + line.size() > budget) {
        next = h.owner;
        break;
      }
      text += line;
      previous_path = h.path;
      previous_line = h.line;
      json item = {{"path", text::sanitize_utf8(h.path)}, {"line", h.line}, {"text", body}, {"match", h.match}};
      items.push_back(std::move(item));
      if (h.match) ++shown_items;
    }
    if (!next && first + shown_items < total) next = first + shown_items;
  }
  json structured = {{"mode", mode}, {"items", items}, {"total", total}, {"offset", first}, {"complete", partial.empty()}};
  if (next) structured["next_offset"] = *next;
  const char* unit = mode == "lines" ? "matching line" : "file";
  std::string head = fmt::format("{} {}{} in {}", total, unit, total == 1 ? "" : "s", path);
  if (total) head += fmt::format(", showing {}-{}", first + 1, first + shown_items);
  if (next) head += fmt::format(" (more: offset {})", *next);
  if (!partial.empty()) head += "; " + partial;
  if (o.status.exit_code == 2) head += "; rg reported: " + text::truncate_utf8(text::sanitize_utf8(o.err), 300);
  return mcp::ToolResult::text(head + "\n" + text, std::move(structured));
}

// ---------------------------------------------------------------------------------------------
// file_info, move_file, copy_file, delete_file

mcp::ToolResult file_info(const ToolContext& ctx, const json& args) {
  Scope s = open_scope(ctx, args);
  const files::Location at = s.files->resolve(path_arg(args));
  const std::string shown = at.shown();
  struct stat st;
  try {
    st = files::stat_at(at, false);
  } catch (const SysError& e) {
    fail(e, shown);
  }
  const files::EntryType type = files::entry_type(st.st_mode);
  json out = {{"path", shown},
              {"type", files::to_string(type)},
              {"size_bytes", static_cast<std::uint64_t>(st.st_size)},
              {"mode", mode_string(st.st_mode)},
              {"modified", iso_of(st.st_mtim)},
              {"uid", st.st_uid},
              {"gid", st.st_gid}};
  std::string text = fmt::format("{}: {}, {}, mode {}, modified {}, uid {}", shown, files::to_string(type),
                                 human_bytes(static_cast<std::uint64_t>(st.st_size)), mode_string(st.st_mode),
                                 out["modified"].get<std::string>(), st.st_uid);
  if (type == files::EntryType::symlink) {
    try {
      const std::string target = text::sanitize_utf8(files::read_link(at));
      out["link_target"] = target;
      text += ", link to " + target;
      const struct stat ts = files::stat_at(at, true);
      out["target_type"] = files::to_string(files::entry_type(ts.st_mode));
      text += fmt::format(" ({})", files::to_string(files::entry_type(ts.st_mode)));
    } catch (const SysError&) {
      out["target_type"] = "unreachable";
      text += " (dangling, or leading outside the instance's files)";
    }
  }
  if (type == files::EntryType::file) {
    try {
      files::Opened o = files::open_read(at);
      const files::Kind kind = files::sniff(pread_some(o.fd.get(), kSniffBytes), leaf_name(at.rel));
      static const char* kClass[] = {"text", "image", "binary", "empty"};
      out["kind"] = kClass[static_cast<int>(kind.cls)];
      out["mime"] = kind.mime;
      out["description"] = kind.description;
      text += fmt::format("; {} ({})", kind.description, kind.mime);
      if (o.st.st_size <= static_cast<off_t>(kMaxEditBytes)) {
        const std::string sha = files::sha256_hex(pread_some(o.fd.get(), static_cast<std::size_t>(o.st.st_size)));
        out["sha256"] = sha;
        text += ", sha256 " + sha;
      }
    } catch (const SysError& e) {
      text += fmt::format("; not readable: {}", e.what());
    }
  }
  return mcp::ToolResult::text(std::move(text), std::move(out));
}

mcp::ToolResult move_or_copy(const ToolContext& ctx, const json& args, bool move, const mcp::RequestContext& rc) {
  Scope s = open_scope(ctx, args);
  const files::Location from =
      s.files->resolve(path_arg(args, "source"), move ? files::InstanceFiles::Follow::not_last : files::InstanceFiles::Follow::last);
  const files::Location to = s.files->resolve(path_arg(args, "destination"));
  const bool overwrite = bool_arg(args, "overwrite", false);
  // The source must be there (a copy reads what a link there leads to): else the error names it.
  auto check_source = [&] {
    try {
      files::stat_at(from, !move);
    } catch (const SysError& e) {
      if (e.code() != ENOENT) fail(e, from.shown());
      bool dangling = false;
      try {
        dangling = !move && S_ISLNK(files::stat_at(from, false).st_mode);
      } catch (const SysError&) {
      }
      if (dangling) throw UsageError(fmt::format("The source {} is a link to something that does not exist", from.shown()));
      throw UsageError(fmt::format("The source does not exist: {} (list_directory shows what is there)", from.shown()));
    }
  };
  check_source();
  const files::Cancelled cancelled = [&rc] { return rc.cancelled(); };
  try {
    if (!move) {
      files::copy(from, to, overwrite, cancelled);
    } else {
      try {
        files::rename(from, to, overwrite);
      } catch (const SysError& e) {
        // The workspace and the output folder on different filesystems: copy, then delete.
        if (e.code() != EXDEV) throw;
        files::copy(from, to, overwrite, cancelled);
        files::remove(from, true);
      }
    }
  } catch (const SysError& e) {
    if (e.code() == ENOENT) {
      check_source();  // gone meanwhile: says so; else the destination's folder is what is missing
      const auto slash = to.rel.rfind('/');
      throw UsageError(fmt::format("The destination's parent directory does not exist: {}",
                                   files::Location{to.root, slash == std::string::npos ? "" : to.rel.substr(0, slash)}.shown()));
    }
    if (e.code() == EEXIST) fail(e, to.shown());
    if (e.code() == ENOTEMPTY) fail(e, to.shown());
    fail(e, from.shown());
  }
  json out = {{"source", from.shown()}, {"destination", to.shown()}};
  return mcp::ToolResult::text(fmt::format("{} {} to {}", move ? "Moved" : "Copied", from.shown(), to.shown()), std::move(out));
}

mcp::ToolResult delete_file(const ToolContext& ctx, const json& args) {
  Scope s = open_scope(ctx, args);
  const files::Location at = s.files->resolve(path_arg(args));
  const bool recursive = bool_arg(args, "recursive", false);
  std::string what;
  try {
    const struct stat st = files::stat_at(at, false);
    what = files::to_string(files::entry_type(st.st_mode));
    if (S_ISDIR(st.st_mode) && !recursive)
      throw UsageError(fmt::format("{} is a directory; set recursive=true to delete it with everything in it", at.shown()));
    files::remove(at, recursive);
  } catch (const SysError& e) {
    fail(e, at.shown());
  }
  json out = {{"path", at.shown()}, {"type", what}};
  return mcp::ToolResult::text(fmt::format("Deleted {} ({})", at.shown(), what), std::move(out));
}

// ---------------------------------------------------------------------------------------------
// Schemas

// Paths are as the sandbox sees them (relative to the workspace, or absolute under the workspace or
// the output folder): said once, in the server's instructions.
json path_property(const char* what) { return {{"type", "string"}, {"minLength", 1}, {"description", what}}; }

json sha_property() {
  return {{"type", "string"}, {"pattern", "^[0-9a-fA-F]{64}$"}, {"description", "Only if the file's sha256 is this."}};
}

}  // namespace

// Up to `max` bytes from `at`. Room for `max` is reserved, not filled: its pages are touched as
// data comes, so a limit of 32 MiB costs the server what the file has, not 32 MiB a call.
std::string pread_some(int fd, std::size_t max, off_t at) {
  std::string out;
  out.reserve(max);
  std::size_t got = 0;
  while (got < max) {
    const std::size_t room = std::min<std::size_t>(max - got, 1 << 20);
    out.resize(got + room);
    const ssize_t n = ::pread(fd, out.data() + got, room, at + static_cast<off_t>(got));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw SysError(errno, "read");
    }
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  out.resize(got);
  return out;
}

// The whole file (at most `max` bytes, else UsageError naming the limit).
std::string read_whole(const files::Opened& o, std::uint64_t max, const std::string& shown, const char* what) {
  if (static_cast<std::uint64_t>(o.st.st_size) > max)
    throw UsageError(fmt::format("File is {} bytes; {} limit is {} bytes: {}", o.st.st_size, what, max, shown));
  std::string data = pread_some(o.fd.get(), static_cast<std::size_t>(max) + 1);
  if (data.size() > max)
    throw UsageError(fmt::format("File is over {} bytes ({} limit): {}", max, what, shown));
  return data;
}

// The decoder works for the instance: within its memory limit ([namespace] limits), when smaller
// — but never below what the decoder needs to start at all (the program itself, mapped).
files::ImageLimits image_limits(const config::Config& config) {
  constexpr std::size_t kDecoderFloor = std::size_t{64} << 20;
  files::ImageLimits limits;
  const auto& instance_limits = config.ns.limits;
  if (auto memory = instance_limits.find("memory"); memory != instance_limits.end() && memory->second > 0)
    limits.max_memory =
        std::max(kDecoderFloor, std::min(limits.max_memory, static_cast<std::size_t>(memory->second) << 20));
  return limits;
}

void add_file_tools(mcp::Server& server, const ToolContext& ctx) {
  const config::Config& cfg = ctx.services.config;
  const json str = of_type("string");

  add_tool(server, {
      .name = "read_file",
      .description = fmt::format(
          "Read a file: text as numbered lines, a page at a time (lines over {} characters cut in the text), with "
          "its sha256 for write/edit guards; PNG, JPEG, GIF and WebP as images; other binary files described.",
          kMaxLineChars),
      .input = instance_input(cfg,
                              {{"path", path_property("File path.")},
                               {"offset", {{"type", "integer"}, {"minimum", 1}, {"description", "First line (default 1)."}}},
                               {"limit",
                                {{"type", "integer"},
                                 {"minimum", 1},
                                 {"maximum", kMaxLines},
                                 {"description", fmt::format("Lines (default {}; fewer past {} characters).",
                                                             kDefaultLines, cfg.mcp.max_result_chars)}}}},
                              {"path"}),
      // path, type (text, image, binary), mime, size_bytes, sha256; text: content (the lines read,
      // exactly), offset, lines, total_lines, next_offset, complete, long_lines_cut, content_cut, eol;
      // image: width, height, scaled, shown_width, shown_height.
      .output = result_object({"path", "type"}),
      .hints = {.read_only = true},
      .handler = [ctx](const json& args, mcp::RequestContext&) { return read_file(ctx, args); },
  });

  add_tool(server, {
      .name = "write_file",
      .description = "Create or replace a whole file atomically (a replaced file keeps its mode). Small changes: "
                     "edit_file.",
      .input = instance_input(
          cfg,
          {{"path", path_property("File path.")},
           {"content", {{"type", "string"}, {"description", fmt::format("The content (at most {} MiB).", kMaxWriteBytes >> 20)}}},
           {"encoding", {{"type", "string"}, {"enum", {"text", "base64"}}, {"description", "Default text."}}},
           {"create_parent_directories", {{"type", "boolean"}, {"description", "Default true."}}},
           {"expected_sha256", sha_property()}},
          {"path", "content"}),
      // path, size_bytes, sha256, created, created_parent_directories, mode.
      .output = result_object({"sha256"}),
      .hints = {.destructive = true, .idempotent = true},
      .handler = [ctx](const json& args, mcp::RequestContext&) { return write_file(ctx, args); },
  });

  add_tool(server, {
      .name = "edit_file",
      .description = "Replace old_text by new_text exactly (whitespace counts; once unless replace_all); a miss "
                     "shows the nearest near-match. CRLF is kept.",
      .input = instance_input(
          cfg,
          {{"path", path_property("File path.")},
           {"old_text", {{"type", "string"}, {"minLength", 1}, {"description", "Text as in the file (no line numbers)."}}},
           {"new_text", {{"type", "string"}, {"description", "Replacement (\"\" deletes)."}}},
           {"replace_all", {{"type", "boolean"}, {"description", "Every occurrence."}}},
           {"expected_sha256", sha_property()}},
          {"path", "old_text", "new_text"}),
      // path, replacements, sha256, size_bytes, first_line.
      .output = result_object({"sha256"}),
      .hints = {.destructive = true, },
      .handler = [ctx](const json& args, mcp::RequestContext&) { return edit_file(ctx, args); },
  });

  add_tool(server, {
      .name = "list_directory",
      .description = "List a directory sorted by path, paged; depth > 1 descends (links not followed).",
      .input = instance_input(
          cfg,
          {{"path", {{"type", "string"}, {"description", fmt::format("Directory (default {}).", cfg.ns.workspace_mount)}}},
           {"depth", {{"type", "integer"}, {"minimum", 1}, {"maximum", 20}, {"description", "Levels (default 1)."}}},
           {"include", {{"type", "array"}, {"items", str}, {"maxItems", 64}, {"description", "Globs on names (paths with /)."}}},
           {"exclude", {{"type", "array"}, {"items", str}, {"maxItems", 64}, {"description", "Globs to leave out."}}},
           {"types", {{"type", "array"}, {"items", {{"type", "string"}, {"enum", {"file", "directory", "symlink", "other"}}}}, {"description", "Only these."}}},
           {"offset", {{"type", "integer"}, {"minimum", 0}, {"description", "Entries to skip."}}},
           {"limit", {{"type", "integer"}, {"minimum", 1}, {"maximum", 2000}, {"description", "Per page (default 200)."}}}}),
      // path, entries: {path, name, type, size_bytes, mode, link_target}, total, offset, next_offset,
      // walk_cut.
      .output = result_object({"entries", "total"}),
      .hints = {.read_only = true},
      .handler = [ctx](const json& args, mcp::RequestContext&) { return list_directory(ctx, args); },
  });

  add_tool(server, {
      .name = "search_files",
      .description = "ripgrep in the instance: a regex over contents and/or name globs. Skips hidden and ignored "
                     "files unless include_hidden.",
      .input = instance_input(
          cfg,
          {{"pattern", {{"type", "string"}, {"description", "Regex (rg syntax)."}}},
           {"glob", {{"type", "array"}, {"items", str}, {"maxItems", 64}, {"description", "Name globs (! excludes)."}}},
           {"path", {{"type", "string"}, {"description", fmt::format("Where (default {}).", cfg.ns.workspace_mount)}}},
           {"mode", {{"type", "string"}, {"enum", {"files", "lines", "counts"}}, {"description", "Default lines with a pattern, else files."}}},
           {"context", {{"type", "integer"}, {"minimum", 0}, {"maximum", 20}, {"description", "Lines around a match."}}},
           {"case_insensitive", {{"type", "boolean"}, {"description", "Ignore case."}}},
           {"include_hidden", {{"type", "boolean"}, {"description", "Hidden and ignored files too."}}},
           {"offset", {{"type", "integer"}, {"minimum", 0}, {"description", "Results to skip."}}},
           {"limit", {{"type", "integer"}, {"minimum", 1}, {"maximum", 1000}, {"description", "Per page (default 100)."}}}}),
      // mode, items: {path, line, text, match, count}, total (matches, or files), offset,
      // next_offset, complete (false: stopped for time or size).
      .output = result_object({"items", "total"}),
      .hints = {.read_only = true},
      .handler = [ctx](const json& args, mcp::RequestContext& rc) { return search_files(ctx, args, rc); },
  });

  add_tool(server, {
      .name = "file_info",
      .description = "Type, size, mode, owner and time of a path (a link itself, with its target); a file's kind "
                     "and sha256.",
      .input = instance_input(cfg, {{"path", path_property("Path.")}}, {"path"}),
      // path, type, size_bytes, mode, modified, uid, gid, link_target, target_type, kind, mime,
      // description, sha256.
      .output = result_object({"path", "type"}),
      .hints = {.read_only = true},
      .handler = [ctx](const json& args, mcp::RequestContext&) { return file_info(ctx, args); },
  });

  const json move_input = instance_input(
      cfg,
      {{"source", path_property("From.")},
       {"destination", path_property("To (its parent must exist).")},
       {"overwrite", {{"type", "boolean"}, {"description", "Replace an existing destination."}}}},
      {"source", "destination"});
  const json move_output = result_object({"destination"});
  add_tool(server, {
      .name = "move_file",
      .description = "Move or rename a file or directory (a link as a link).",
      .input = move_input,
      .output = move_output,
      .hints = {.destructive = true, },
      .handler = [ctx](const json& args, mcp::RequestContext& rc) { return move_or_copy(ctx, args, true, rc); },
  });
  add_tool(server, {
      .name = "copy_file",
      .description = "Copy a file (mode kept) or a tree (links as links), whole or not at all.",
      .input = move_input,
      .output = move_output,
      .hints = {.destructive = false, .idempotent = true},
      .handler = [ctx](const json& args, mcp::RequestContext& rc) { return move_or_copy(ctx, args, false, rc); },
  });
  add_tool(server, {
      .name = "delete_file",
      .description = "Delete a file or link (never its target); a directory only with recursive.",
      .input = instance_input(cfg,
                              {{"path", path_property("Path.")},
                               {"recursive", {{"type", "boolean"}, {"description", "A directory with all in it."}}}},
                              {"path"}),
      .output = result_object({"path"}),
      .hints = {.destructive = true, },
      .handler = [ctx](const json& args, mcp::RequestContext&) { return delete_file(ctx, args); },
  });
}

// ---------------------------------------------------------------------------------------------
// resource://ns-hpc/instances/{id}/files/{path}

std::optional<std::vector<mcp::ResourceContents>> read_file_resource(const ToolContext& ctx, const std::string& uri,
                                                                     const std::string& id, const std::string& encoded) {
  // The path is percent-encoded when the client expanded the template (RFC 6570: '/' as %2F).
  std::string path;
  for (std::size_t i = 0; i < encoded.size(); ++i) {
    if (encoded[i] == '%' && i + 2 < encoded.size() && std::isxdigit(static_cast<unsigned char>(encoded[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(encoded[i + 2]))) {
      path += static_cast<char>(std::stoi(encoded.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      path += encoded[i];
    }
  }
  if (path.empty() || path.find('\0') != std::string::npos) return std::nullopt;
  try {
    store::validate_id(id);
  } catch (const UsageError&) {
    return std::nullopt;
  }
  if (!ctx.services.instances.store().exists(id)) return std::nullopt;
  Scope s = open_scope(ctx, id);
  files::Location at;
  try {
    at = s.files->resolve(path.front() == '/' ? path : "/" + path, files::InstanceFiles::Follow::last);
  } catch (const UsageError&) {
    try {
      at = s.files->resolve(path, files::InstanceFiles::Follow::last);  // relative to the workspace
    } catch (const UsageError&) {
      return std::nullopt;
    }
  }
  files::Opened o;
  try {
    o = files::open_read(at);
  } catch (const SysError& e) {
    if (e.code() == ENOENT || e.code() == ENOTDIR) return std::nullopt;
    throw mcp::ProtocolError(mcp::kInvalidParams, fmt::format("{} is not readable: {}", at.shown(), e.what()));
  }
  if (o.is_dir()) {
    std::string listing;
    auto entries = files::list_dir(at);
    std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    for (const auto& e : entries)
      listing += text::sanitize_utf8(e.name) + (e.type == files::EntryType::directory ? "/" : "") + "\n";
    return std::vector<mcp::ResourceContents>{{uri, "text/plain", std::move(listing), std::nullopt}};
  }
  if (static_cast<std::uint64_t>(o.st.st_size) > kMaxResourceBytes)
    throw mcp::ProtocolError(mcp::kInvalidParams, fmt::format("{} is {} bytes; resources are read up to {} bytes",
                                                              at.shown(), o.st.st_size, kMaxResourceBytes));
  std::string data = pread_some(o.fd.get(), static_cast<std::size_t>(kMaxResourceBytes));
  const files::Kind kind = files::sniff(std::string_view(data).substr(0, kSniffBytes), leaf_name(at.rel));
  const bool is_text = (kind.cls == files::Kind::Class::text || kind.cls == files::Kind::Class::empty) &&
                       !text::find_invalid_utf8(data);
  if (is_text) return std::vector<mcp::ResourceContents>{{uri, kind.mime, std::move(data), std::nullopt}};
  return std::vector<mcp::ResourceContents>{{uri, kind.mime, std::nullopt, files::base64_encode(data)}};
}

}  // namespace nshpc::tools
