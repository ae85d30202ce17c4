// The persisted handle on an execution: what a caller keeps (in a job's record; a living sandbox
// keeps its own in its state folder) to find the execution again after a restart, through the
// backend that made it (Backend::attach). On disk:
//   {"backend": "bwrap", "version": 1, "data": {...}}
// `data` is the backend's own, read by it alone; callers never look inside.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "base/json.hpp"

namespace nshpc::sandbox {

struct ExecutionHandle {
  // The version written now: the layout of `data` for its backend.
  static constexpr int kVersion = 1;
  // Version 0: a handle of a release before handles said whose they were (a job record's untyped
  // "handle" object, or its even older bwrap fields; a living sandbox's state folder without its
  // handle file). Every execution was bwrap's then.
  static constexpr const char* kUntypedBackend = "bwrap";

  std::string backend;  // Backend::name() of the backend that made it; empty: none (yet)
  int version = kVersion;
  nlohmann::json data = nlohmann::json::object();

  bool empty() const { return backend.empty() && data.empty(); }
  bool operator==(const ExecutionHandle& other) const {
    return backend == other.backend && version == other.version && data == other.data;
  }

  nlohmann::json to_json() const { return {{"backend", backend}, {"version", version}, {"data", data}}; }

  // Whether `j` is in the typed form (it has "data"; an untyped handle of an earlier release never
  // had that key), whatever its values.
  static bool typed(const nlohmann::json& j) { return j.is_object() && j.contains("data"); }

  // The typed form: a backend's name, a version of 0 or more and an object of data; nullopt for
  // anything else.
  static std::optional<ExecutionHandle> from_json(const nlohmann::json& j) {
    if (!typed(j)) return std::nullopt;
    const auto backend = j.find("backend");
    const auto version = j.find("version");
    const auto& data = j.at("data");
    if (backend == j.end() || !backend->is_string() || backend->get_ref<const std::string&>().empty()) return std::nullopt;
    if (version == j.end() || !version->is_number_integer()) return std::nullopt;
    const auto number = version->get<std::int64_t>();
    if (number < 0 || number > std::numeric_limits<int>::max() || !data.is_object()) return std::nullopt;
    return ExecutionHandle{backend->get<std::string>(), static_cast<int>(number), data};
  }

  // An earlier release's untyped handle object (version 0, bwrap's).
  static ExecutionHandle untyped(nlohmann::json old) { return {kUntypedBackend, 0, std::move(old)}; }
};

}  // namespace nshpc::sandbox
