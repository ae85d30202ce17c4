// The computer's file tools (read_file, write_file, edit_file): the seed's 0.2.3 contract
// (reference/virtual-computer.md §1.3: every path of the computer, absolute or relative to
// /workspace; UTF-8 text of at most 1 MiB; its fields and messages; an atomic write through a
// temporary beside the file and a rename, keeping the old file's mode; an edit guarded by the
// sha256 of what it read), plus images for read_file as `ns-hpc run` shows them.
//
// Done in this process, not by a process in the computer: through the files resolver
// (files/resolver.hpp, as `ns-hpc run`'s file tools) beneath the computer's own root, the root
// folder of its running sandbox (instances::Service::root_of_running). That root is confined
// (files::Root::confine): only the computer's own regular files and folders on the file systems
// its files are on are read or changed — never its /proc, /proc/sys, /dev, devpts or mqueue,
// whose files this process (as root: every capability on the host) could read or write far
// beyond what the computer itself may, nor a file or folder of another uid. A link or ".." never
// leads out of the computer, a FIFO or device is never opened, and a write never follows a link
// at its last component. A normal user's server has its broker do what it may not do itself to
// the files of accounts made inside, as the computer's root could.
#include "tools/computer_files.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/text.hpp"
#include "files/content.hpp"
#include "files/image.hpp"
#include "files/resolver.hpp"
#include "instances/instances.hpp"
#include "tools/computer_contract.hpp"

namespace nshpc::tools::computer {

namespace {

using mcp::json;

constexpr std::size_t kFileTextLimit = 1048576;      // the seed's file_text_limit
constexpr std::size_t kPagedTextLimit = 64ULL << 20;  // a text read_file shows a page of
constexpr std::uint64_t kMaxImageBytes = 32ULL << 20;  // an image file read_file shows (as ns-hpc run's)
constexpr std::size_t kSniffBytes = 8192;
const std::string kWorkspace = "/workspace";

struct Tools {
  FileToolHooks hooks;
  const config::Config& config() const { return hooks.ctx.services.config; }
  instances::Service& instances() const { return hooks.ctx.services.instances; }
};
using ToolsPtr = std::shared_ptr<const Tools>;

std::string path_of(const json& args) {
  const std::string path = string_arg(args, "path");
  if (path.empty()) throw UsageError("path is required (absolute, or relative to /workspace)");
  if (path.find('\0') != std::string::npos) throw UsageError("path must not contain a NUL byte");
  if (path.size() > files::kMaxPathBytes)
    throw UsageError(fmt::format("path is {} bytes; the limit is {} bytes (PATH_MAX)", path.size(), files::kMaxPathBytes));
  return path;
}

// The path as the seed shows it: absolute, relative ones under /workspace.
std::string shown_path(const std::string& path) { return path.front() == '/' ? path : kWorkspace + "/" + path; }

// The path beneath the computer's root: its components but "" and "."; ".." is left to the
// kernel, which resolves it after the links before it, as a command in the computer would, and
// never above the root.
std::string rel_of(const std::string& shown) {
  std::string rel;
  std::size_t start = 0;
  while (start <= shown.size()) {
    std::size_t end = shown.find('/', start);
    if (end == std::string::npos) end = shown.size();
    const std::string_view part(shown.data() + start, end - start);
    if (!part.empty() && part != ".") (rel += rel.empty() ? "" : "/") += part;
    start = end + 1;
  }
  return rel;
}

// The computer's root while a call works in it; `at` points into it (never moved).
struct InComputer {
  instances::Service::RunningRoot running;
  std::string rel;
  files::Location at() const { return files::Location{&running.root, rel}; }
};

InComputer enter(const Tools& t, const store::Instance& inst, const std::string& shown, mcp::RequestContext& rc) {
  return InComputer{t.instances().root_of_running(inst, actor(rc)), rel_of(shown)};
}

bool is_link(const files::Location& at) {
  try {
    return S_ISLNK(files::stat_at(at, false).st_mode);
  } catch (const SysError&) {
    return false;
  }
}

[[noreturn]] void irregular(const std::string& shown) {
  throw UsageError(fmt::format("Path is not a regular file: {}", shown));
}

// What the confinement refused (files::Root::confine): a kernel interface, a file of another uid.
[[noreturn]] void refused(const SysError& e) {
  throw UsageError(fmt::format("{}; the file tools reach only the computer's own files (terminal_execute does what "
                               "the computer itself may)",
                               e.what()));
}

// A refused or failed read, in the seed's words where it has them.
[[noreturn]] void fail_read(const SysError& e, const files::Location& at, const std::string& shown) {
  switch (e.code()) {
    case ENOENT:
    case ENOTDIR:
      // A link that leads nowhere is there though: the seed's `[ -e f ] || [ -L f ]`.
      if (e.code() == ENOENT && is_link(at)) irregular(shown);
      throw UsageError(fmt::format("File does not exist: {}", shown));
    case ENXIO:
    case EISDIR:
    case ELOOP: irregular(shown);
    case EPERM: refused(e);
    default: throw UsageError(fmt::format("{}: {}", shown, e.what()));
  }
}

files::Opened open_file(const files::Location& at, const std::string& shown) {
  files::Opened o;
  try {
    o = files::open_read(at);
  } catch (const SysError& e) {
    fail_read(e, at, shown);
  }
  if (o.is_dir()) irregular(shown);
  return o;
}

std::string checked_utf8(std::string data, const std::string& shown) {
  if (auto bad = text::find_invalid_utf8(data))
    throw UsageError(fmt::format("File is not valid UTF-8 text at byte {}: {}", *bad, shown));
  return data;
}

json file_result(const Tools& t, const store::Instance& inst, const char* operation, const std::string& shown,
                 std::uint64_t size, const std::string& sha256) {
  json out = t.hooks.common(inst, operation);
  out["path"] = shown;
  out["size_bytes"] = size;
  out["sha256"] = sha256;
  return out;
}

// ---------------------------------------------------------------------------------------------
// read_file

// An image (PNG, JPEG, GIF, WebP) as `ns-hpc run`'s read_file shows it: decoded and, past 1568
// pixels a side or 1.5 MiB, scaled down and encoded again by the sandboxed decoder
// (files/image.hpp), as an image block after the seed's fields. Its `content` is empty (an image
// has no text); `image` says what it is and how it is shown.
mcp::ToolResult read_image(const Tools& t, const store::Instance& inst, const files::Opened& o, const std::string& shown,
                           const files::Kind& kind) {
  const std::string data = read_whole(o, kMaxImageBytes, shown, "image tool");
  const files::ImageLimits limits = image_limits(t.config());
  files::Thumbnail thumb;
  try {
    thumb = files::make_thumbnail(data, kind.mime, limits);
  } catch (const Error& e) {
    throw UsageError(fmt::format("{} ({}, {} bytes) could not be shown: {}", shown, kind.description, data.size(),
                                 e.what()));
  }
  json out = file_result(t, inst, "read_file", shown, data.size(), files::sha256_hex(data));
  out["content"] = "";
  out["visualization_warning"] = nullptr;
  out["image"] = {{"mime", kind.mime},         {"width", thumb.original_width}, {"height", thumb.original_height},
                  {"scaled", thumb.scaled},    {"shown_mime", thumb.mime},      {"shown_width", thumb.width},
                  {"shown_height", thumb.height}};
  mcp::ToolResult r = t.hooks.result(std::move(out));
  r.content.push_back({{"type", "image"}, {"data", files::base64_encode(thumb.data)}, {"mimeType", thumb.mime}});
  return r;
}

// The line read_file starts at: `offset` (1-based), 1 when not given.
std::size_t offset_arg(const json& args) {
  auto it = args.find("offset");
  if (it == args.end() || it->is_null()) return 1;
  if (!it->is_number_integer() || it->get<std::int64_t>() < 1)
    throw UsageError("offset must be a line number (1 or more)");
  return static_cast<std::size_t>(it->get<std::int64_t>());
}

// A page of `content` from line `first` that keeps the result `out` within
// computer::kResultBytes (its content is in the result twice, as the seed shapes it): whole lines
// while they fit; a first line that alone does not is cut (`line_cut`). Sets content, and, when
// the page is not the whole file, `lines` {first, last, total} and `next_offset` while lines remain.
void page_of(json& out, const std::string& content, std::size_t first) {
  std::vector<std::string_view> lines;
  for (std::size_t at = 0; at < content.size();) {
    const std::size_t nl = content.find('\n', at);
    const std::size_t end = nl == std::string::npos ? content.size() : nl + 1;
    lines.emplace_back(content.data() + at, end - at);
    at = end;
  }
  const std::size_t total = lines.size();
  if (first > std::max<std::size_t>(total, 1))
    throw UsageError(fmt::format("offset {} is past the end: the file has {} line(s)", first, total));
  out["content"] = "";
  const std::size_t room = kResultBytes - std::min(kResultBytes, result_bytes(out));
  // Each byte of content costs its escaped size twice over (structuredContent, and the text that
  // is the JSON escaped again); counted per line, a little over (the quotes of each piece).
  auto cost = [](std::string_view line) {
    const std::string once = json(line).dump(-1, ' ', false, json::error_handler_t::replace);
    return once.size() + json(once).dump(-1, ' ', false, json::error_handler_t::replace).size();
  };
  std::size_t last = first - 1, used = 0;
  while (last < total && used + cost(lines[last]) <= room) used += cost(lines[last++]);
  std::string page;
  bool cut = false;
  if (last == first - 1 && first <= total) {
    // One line longer than a page: as much of it as fits.
    std::string_view line = lines[first - 1];
    std::size_t keep = line.size();
    while (keep > 0 && cost(line.substr(0, keep)) > room) keep = keep * 3 / 4;
    page = text::truncate_utf8(line, keep);
    last = first;
    cut = true;
  } else {
    for (std::size_t i = first - 1; i < last; ++i) page += lines[i];
  }
  const bool whole = first == 1 && last == total && !cut;
  out["content"] = std::move(page);
  if (whole) return;
  out["lines"] = {{"first", first}, {"last", last}, {"total", total}};
  if (cut) out["line_cut"] = true;
  if (last < total) out["next_offset"] = last + 1;
}

mcp::ToolResult read_file(const Tools& t, const json& args, mcp::RequestContext& rc) {
  const std::string shown = shown_path(path_of(args));
  const std::size_t first = offset_arg(args);
  const store::Instance inst = t.hooks.computer_for(args, rc);
  const InComputer in = enter(t, inst, shown, rc);
  const files::Opened o = open_file(in.at(), shown);
  const files::Kind kind = files::sniff(pread_some(o.fd.get(), kSniffBytes), shown.substr(shown.rfind('/') + 1));
  if (kind.cls == files::Kind::Class::image) return read_image(t, inst, o, shown, kind);
  // The seed's whole file stops at 1 MiB; pages go on to kPagedTextLimit.
  const std::string content = checked_utf8(
      t.hooks.whole_output ? read_whole(o, kFileTextLimit, shown, "text tool") : read_whole(o, kPagedTextLimit, shown, "read_file's paged text"),
      shown);
  json out = file_result(t, inst, "read_file", shown, content.size(), files::sha256_hex(content));
  out["visualization_warning"] = nullptr;
  if (t.hooks.whole_output && first == 1)
    out["content"] = content;  // the seed's: the whole file, whatever its size
  else
    page_of(out, content, first);
  return t.hooks.result(std::move(out));
}

// ---------------------------------------------------------------------------------------------
// write_file, edit_file

std::string content_arg(const json& args, const char* name) {
  auto it = args.find(name);
  if (it == args.end() || !it->is_string()) throw UsageError(fmt::format("{} is required (a string)", name));
  return it->get<std::string>();
}

void check_size(const std::string& content) {
  if (content.size() > kFileTextLimit)
    throw UsageError(fmt::format("Content is {} bytes; text tool limit is {} bytes", content.size(), kFileTextLimit));
}

// The seed writes only where nothing is, a regular file is, or a link is that leads to one or to
// nothing (the link is replaced, never written through); a folder, a FIFO, a socket or a device
// there is "not a regular file".
void refuse_irregular(const files::Location& at, const std::string& shown) {
  struct stat st;
  try {
    st = files::stat_at(at, false);
  } catch (const SysError& e) {
    if (e.code() == ENOENT || e.code() == ENOTDIR || e.code() == EBUSY) return;  // the write says what is wrong
    throw;
  }
  if (S_ISREG(st.st_mode)) return;
  if (!S_ISLNK(st.st_mode)) irregular(shown);
  try {
    if (!S_ISREG(files::stat_at(at, true).st_mode)) irregular(shown);
  } catch (const SysError&) {
    // leads nowhere (or out of reach): the link itself is replaced
  }
}

[[noreturn]] void fail_write(const SysError& e, const std::string& shown, bool parents) {
  switch (e.code()) {
    case ENOENT:
    case ENOTDIR:
      if (!parents) throw UsageError(fmt::format("Parent directory does not exist: {}", shown));
      break;
    case EISDIR:
    case EBUSY: irregular(shown);
    case EPERM: refused(e);
    default: break;
  }
  throw UsageError(fmt::format("{}: {}", shown, e.what()));
}

// Writes `content` at `at` atomically (files::begin_write: a temporary beside it, the old file's
// mode, given to the computer's root when new, one rename). With `guard`, refused unless the file
// there still has that sha256. Returns whether parent folders were made.
bool write_at(const files::Location& at, const std::string& shown, const std::string& content, bool parents,
              const std::optional<std::string>& guard) {
  bool made = false;
  try {
    refuse_irregular(at, shown);
    if (parents) {
      const auto slash = at.rel.rfind('/');
      if (slash != std::string::npos) {
        try {
          files::stat_at(files::Location{at.root, at.rel.substr(0, slash)}, true);
        } catch (const SysError& e) {
          made = e.code() == ENOENT;
        }
      }
    }
    files::WriteOptions options;
    options.create_parents = parents;
    std::unique_ptr<files::PendingFile> pending = files::begin_write(at, options);
    if (guard) {
      std::optional<std::string> now;
      try {
        if (std::optional<UniqueFd> current = pending->open_current()) {
          files::Opened o;
          o.fd = std::move(*current);
          if (::fstat(o.fd.get(), &o.st) == 0 && static_cast<std::size_t>(o.st.st_size) <= kFileTextLimit)
            now = files::sha256_hex(pread_some(o.fd.get(), kFileTextLimit + 1));
        }
      } catch (const SysError& e) {
        if (e.code() != ELOOP) throw;
        // A link: read where it leads, as the edit read it.
        const files::Opened o = files::open_read(at);
        if (!o.is_dir()) now = files::sha256_hex(pread_some(o.fd.get(), kFileTextLimit + 1));
      }
      if (now != guard) throw UsageError("File changed before edit could be saved");
    }
    pending->write(content);
    pending->commit();
  } catch (const SysError& e) {
    fail_write(e, shown, parents);
  }
  return made;
}

mcp::ToolResult write_file(const Tools& t, const json& args, mcp::RequestContext& rc) {
  const std::string shown = shown_path(path_of(args));
  const std::string content = content_arg(args, "content");
  check_size(content);
  auto parents_it = args.find("create_parent_directories");
  const bool parents = parents_it == args.end() || parents_it->is_null() || parents_it->get<bool>();
  const store::Instance inst = t.hooks.computer_for(args, rc);
  const InComputer in = enter(t, inst, shown, rc);
  const bool made = write_at(in.at(), shown, content, parents, std::nullopt);
  json out = file_result(t, inst, "write_file", shown, content.size(), files::sha256_hex(content));
  out["created_parent_directories"] = made;
  return t.hooks.result(std::move(out));
}

mcp::ToolResult edit_file(const Tools& t, const json& args, mcp::RequestContext& rc) {
  const std::string shown = shown_path(path_of(args));
  const std::string old_text = content_arg(args, "old_text");
  const std::string new_text = content_arg(args, "new_text");
  if (old_text.empty()) throw UsageError("old_text must not be empty");
  const bool replace_all = args.contains("replace_all") && args["replace_all"].is_boolean() && args["replace_all"].get<bool>();
  const store::Instance inst = t.hooks.computer_for(args, rc);
  const InComputer in = enter(t, inst, shown, rc);
  std::string before;
  {
    const files::Opened o = open_file(in.at(), shown);
    before = checked_utf8(read_whole(o, kFileTextLimit, shown, "text tool"), shown);
  }
  const std::vector<std::size_t> at = text::find_all(before, old_text);
  if (at.empty()) throw UsageError(fmt::format("old_text was not found in {}", shown));
  if (at.size() > 1 && !replace_all)
    throw UsageError(fmt::format("old_text occurs {} times in {}; provide more surrounding text or set replace_all=true",
                                 at.size(), shown));
  const std::string after = text::replace_at(before, at, old_text.size(), new_text);
  check_size(after);
  write_at(in.at(), shown, after, false, files::sha256_hex(before));
  json out = file_result(t, inst, "edit_file", shown, after.size(), files::sha256_hex(after));
  out["old_text"] = old_text;
  out["new_text"] = new_text;
  out["replacements"] = at.size();
  return t.hooks.result(std::move(out));
}

FileToolBody body(const ToolsPtr& t, mcp::ToolResult (*fn)(const Tools&, const json&, mcp::RequestContext&)) {
  return [t, fn](const json& args, mcp::RequestContext& rc) { return fn(*t, args, rc); };
}

}  // namespace

void add_file_tools(mcp::Server& server, FileToolHooks hooks) {
  const json path_arg = {{"type", "string"}, {"description", "Absolute, or relative to /workspace."}};
  const json computer_arg = hooks.computer_arg;
  auto t = std::make_shared<const Tools>(Tools{std::move(hooks)});
  add_tool(server, {
      .name = "read_file",
      .description = "Read a UTF-8 text file of the computer: its content, size_bytes and sha256; a long one in pages "
                     "(lines, next_offset). PNG, JPEG, GIF and WebP come back as an image.",
      .input = input_object({{"path", path_arg},
                             {"offset", {{"type", "integer"}, {"minimum", 1}, {"description", "First line (default 1)."}}},
                             {"computer_id", computer_arg}},
                            {"path"}),
      .output = result_object({"operation", "computer_id", "path", "content", "size_bytes", "sha256"}),
      .hints = {.read_only = true},
      .handler = t->hooks.working("read_file", body(t, read_file)),
  });
  add_tool(server, {
      .name = "write_file",
      .description = "Write a UTF-8 text file (at most 1 MiB) of the computer atomically, replacing it if it exists.",
      .input = input_object({{"path", path_arg},
                             {"content", {{"type", "string"}, {"description", "The whole new content."}}},
                             {"create_parent_directories",
                              {{"type", "boolean"}, {"description", "Make missing parent folders (default true)."}}},
                             {"computer_id", computer_arg}},
                            {"path", "content"}),
      .output = result_object({"operation", "computer_id", "path", "size_bytes", "sha256", "created_parent_directories"}),
      .hints = {.destructive = true, .idempotent = true},
      .handler = t->hooks.working("write_file", body(t, write_file)),
  });
  add_tool(server, {
      .name = "edit_file",
      .description =
          "Replace old_text (exactly, once unless replace_all) with new_text in a text file of the computer; refused "
          "if the file changes meanwhile.",
      .input = input_object({{"path", path_arg},
                             {"old_text", {{"type", "string"}, {"description", "Text to replace, exactly as in the file."}}},
                             {"new_text", {{"type", "string"}, {"description", "The replacement."}}},
                             {"replace_all", {{"type", "boolean"}, {"description", "Replace every occurrence (default false)."}}},
                             {"computer_id", computer_arg}},
                            {"path", "old_text", "new_text"}),
      .output = result_object({"operation", "computer_id", "path", "size_bytes", "sha256", "replacements"}),
      .hints = {.destructive = true, .idempotent = false},
      .handler = t->hooks.working("edit_file", body(t, edit_file)),
  });
}

}  // namespace nshpc::tools::computer
