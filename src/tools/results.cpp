// Results sized for a model: output cut in the middle to [mcp] max_result_chars (characters,
// not bytes after JSON escaping), the whole of a cut command output kept in a file of the
// instance, and every text of every result bounded the same way.
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/log.hpp"
#include "base/safe_path.hpp"
#include "base/fs.hpp"
#include "base/random.hpp"
#include "base/text.hpp"
#include "base/time.hpp"
#include "tools/internal.hpp"

namespace nshpc::tools {

namespace {

// Room kept for the summary around the output (exit code, duration, paths, markers).
constexpr std::size_t kSummaryRoom = 600;
// Cut outputs of terminal_execute kept per instance (the older ones are removed).
constexpr std::size_t kKeptFullOutputs = 5;
constexpr const char* kFullOutputFolder = ".ns_hpc_output";
constexpr const char* kFullOutputPrefix = "term-";

std::string thousands(std::size_t n) {
  std::string digits = std::to_string(n), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// Writes all of `data` to `fd`.
void write_all(int fd, std::string_view data, const std::string& shown) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      throw SysError(errno, "write", shown);
    }
    data.remove_prefix(static_cast<std::size_t>(n));
  }
}

}  // namespace

std::size_t result_budget(const config::Config& cfg) {
  if (cfg.mcp.max_result_chars <= 0) return SIZE_MAX / 4;  // a Config not read from a file: no bound
  const auto max = static_cast<std::size_t>(cfg.mcp.max_result_chars);
  return max > 2 * kSummaryRoom ? max - kSummaryRoom : max / 2;
}

std::size_t output_budget(const config::Config& cfg) {
  // result_type "both" carries the output twice (the text and structuredContent, for clients
  // that read only one of them): each copy gets half, so the whole result stays in the bound.
  const std::size_t whole = result_budget(cfg);
  return cfg.mcp.result_type == config::ResultType::both ? whole / 2 : whole;
}

std::pair<std::size_t, std::size_t> split_budget(std::size_t a, std::size_t b, std::size_t budget) {
  std::size_t ga = std::min(a, budget / 2), gb = std::min(b, budget / 2);
  std::size_t left = budget - ga - gb;
  const std::size_t more_a = std::min(left, a - ga);
  ga += more_a;
  left -= more_a;
  gb += std::min(left, b - gb);
  return {ga, gb};
}

std::string cut_marker(std::size_t cut, const std::string& whole_in) {
  return whole_in.empty()
             ? fmt::format("[ns-hpc: {} characters cut here]", thousands(cut))
             : fmt::format("[ns-hpc: {} characters cut here; the whole output is in {}]", thousands(cut), whole_in);
}

BoundedOutput bound_output(const ToolContext& ctx, const store::Instance& inst, const std::string& out,
                           const std::string& err, const std::string& raw_out, const std::string& raw_err) {
  const config::Config& cfg = ctx.services.config;
  BoundedOutput b;
  const std::size_t lo = text::utf8_length(out), le = text::utf8_length(err);
  const auto [go, ge] = split_budget(lo, le, output_budget(cfg));
  if (lo <= go && le <= ge) {
    b.out = out;
    b.err = err;
    return b;
  }
  // The whole output, as the command wrote it, in files of the instance (created beneath the
  // workspace without following links, owned by the sandbox's uid); the oldest beyond the last
  // few are removed.
  const std::string stem = fmt::format("{}/{}{}-{}", kFullOutputFolder, kFullOutputPrefix, timeutil::compact_utc(),
                                       random::hex(3));
  auto keep = [&](const std::string& data, const char* ext) -> std::string {
    const std::string relative = stem + "." + ext;
    const std::string shown = cfg.ns.workspace_mount + "/" + relative;
    try {
      UniqueFd fd = ctx.services.instances.store().open_workspace_file(inst, relative, store::Store::WorkspaceOpen::create);
      write_all(fd.get(), data, shown);
      return shown;
    } catch (const std::exception& e) {
      log::warn("instance '{}': the whole output was not kept in {}: {}", inst.id, shown, e.what());
      b.note = fmt::format("[ns-hpc: the whole output could not be kept in a file: {}]", e.what());
      return {};
    }
  };
  if (lo > go) b.out_file = keep(raw_out, "out");
  if (le > ge) b.err_file = keep(raw_err, "err");
  try {
    UniqueFd ws = fs::open_dir_path(inst.workspace);
    for (const char* ext : {".out", ".err"})
      fs::prune_beneath(ws.get(), kFullOutputFolder, kFullOutputPrefix, ext, kKeptFullOutputs);
  } catch (const std::exception& e) {
    log::warn("instance '{}': older cut outputs not removed: {}", inst.id, e.what());
  }
  auto cut = [](const std::string& s, std::size_t budget, const std::string& file, std::size_t& cut_chars) {
    auto c = text::cut_middle(s, budget, [&file](std::size_t n) { return cut_marker(n, file); });
    cut_chars = c.cut_chars;
    return std::move(c.text);
  };
  b.out = cut(out, go, b.out_file, b.out_cut);
  b.err = cut(err, ge, b.err_file, b.err_cut);
  return b;
}

void bound_texts(mcp::ToolResult& result, std::size_t max_chars) {
  if (max_chars == 0 || !result.content.is_array()) return;  // 0: a Config not read from a file
  for (auto& item : result.content) {
    auto text = item.find("text");
    if (text == item.end() || !text->is_string()) continue;
    const std::string& s = text->get_ref<const std::string&>();
    if (s.size() <= max_chars) continue;  // bytes >= characters: nothing to count
    auto c = text::cut_middle(s, max_chars, [](std::size_t n) {
      return fmt::format("[ns-hpc: {} characters of this result cut here; ask for less (a filter, a page)]",
                         thousands(n));
    });
    if (c.cut_chars > 0) *text = std::move(c.text);
  }
}

}  // namespace nshpc::tools
