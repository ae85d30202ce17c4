#include "cli/output.hpp"

#include <algorithm>
#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

#include "base/time.hpp"

namespace nshpc::cli {

nlohmann::json instance_host_json(const store::Instance& inst) {
  nlohmann::json out = {{"id", inst.id},
          {"created_at", inst.meta.created_at()},
          {"description", inst.meta.description()},
          {"hostname", inst.meta.hostname()},
          {"network", config::to_string(inst.network)},
          {"persistent", inst.persistent},
          {"root", inst.meta.root()},
          {"path", inst.base.string()},
          {"workspace", inst.workspace.string()},
          {"output", inst.output.string()},
          {"last_activity", timeutil::iso_utc(inst.last_activity())}};
  if (!inst.network_allow.empty()) out["network_allow"] = inst.network_allow;  // its own additions
  out["desktop"] = inst.meta.desktop();
  return out;
}

nlohmann::json archived_json(const store::ArchivedInstance& a) {
  return {{"name", a.name},
          {"id", a.id},
          {"created_at", a.meta.created_at()},
          {"archived_at", a.meta.archived_at()},
          {"description", a.meta.description()},
          {"path", a.base.string()}};
}

sandbox::ImageVersion build_image(const sandbox::ImageStore& images, const sandbox::ImageBuild& request) {
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  std::fprintf(stderr, "ns-hpc: building image '%s' (%s) in %s\n", request.name.c_str(), request.suite.c_str(),
               images.dir().c_str());
  sandbox::ImageStore store = images;
  const sandbox::ImageVersion v = store.build(request, [tty](std::string_view line) {
    // mmdebstrap's status lines ("I: …", "W: …").
    if (line.empty()) return;
    if (tty)
      std::fprintf(stderr, "\r\033[K%.*s", static_cast<int>(std::min<std::size_t>(line.size(), 160)), line.data());
    else
      std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
  });
  if (tty) std::fputs("\r\033[K", stderr);
  return v;
}

void print_json(const nlohmann::json& value) {
  std::string text = value.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
}

void print_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      if (i + 1 < row.size())
        line += fmt::format("{:<{}}  ", row[i], widths[i]);
      else
        line += row[i];
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    std::puts(line.c_str());
  }
}

std::string short_time(const std::string& iso) {
  auto t = timeutil::parse_iso(iso);
  if (!t) return iso.empty() ? "-" : iso;
  return short_time(*t);
}

std::string short_time(std::chrono::system_clock::time_point t) {
  std::string full = timeutil::iso_utc(t);  // 2026-06-12T10:31:02.123456+00:00
  return full.substr(0, 10) + " " + full.substr(11, 8);
}

}  // namespace nshpc::cli
