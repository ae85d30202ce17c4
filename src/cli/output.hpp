#pragma once

#include <string>
#include <vector>

#include "base/json.hpp"
#include "sandbox/images.hpp"
#include "store/store.hpp"

namespace nshpc::cli {

// An instance as a person on the host sees it: its folders by their host paths. (The MCP tools
// show agents another view, tools' instance_json: the paths inside the sandbox.)
nlohmann::json instance_host_json(const store::Instance& inst);
nlohmann::json archived_json(const store::ArchivedInstance& a);
void print_json(const nlohmann::json& value);

// Prints rows as aligned columns (the last column is not padded).
void print_table(const std::vector<std::vector<std::string>>& rows);

// Builds an image in the foreground, mmdebstrap's status lines on stderr as they come (on a
// terminal each replaces the last): `ns-hpc image build` and `doctor --fix`.
sandbox::ImageVersion build_image(const sandbox::ImageStore& images, const sandbox::ImageBuild& request);

// "2026-06-12 10:31:02" from an ISO time (local to UTC, seconds precision); "-" when empty.
std::string short_time(const std::string& iso);
std::string short_time(std::chrono::system_clock::time_point t);

}  // namespace nshpc::cli
