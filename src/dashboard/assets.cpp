// The embedded assets as views into the blob that dashboard_assets.cpp (generated) holds.
#include "dashboard/assets.hpp"

#include <vector>

#include "base/error.hpp"

extern "C" {
extern const char nshpc_ui_blob[];
extern const char nshpc_ui_blob_end[];
}

namespace nshpc::dashboard {

namespace {

std::vector<Asset> make_table() {
  // The blob and the table come from one build step; a mismatch means a stale object file.
  const auto blob_size = static_cast<std::size_t>(nshpc_ui_blob_end - nshpc_ui_blob);
  if (blob_size != detail::kAssetBlobSize)
    throw Error("the dashboard's embedded assets do not match their table (" + std::to_string(blob_size) +
                " bytes, expected " + std::to_string(detail::kAssetBlobSize) + "); rebuild ns-hpc from a clean build folder");
  std::vector<Asset> table;
  table.reserve(detail::kAssetEntryCount);
  for (std::size_t i = 0; i < detail::kAssetEntryCount; ++i) {
    const detail::AssetEntry& e = detail::kAssetEntries[i];
    table.push_back({e.path, e.mime, e.sha256, std::string_view(nshpc_ui_blob + e.gzip_offset, e.gzip_size),
                     std::string_view(nshpc_ui_blob + e.raw_offset, e.raw_size)});
  }
  return table;
}

}  // namespace

std::span<const Asset> assets() {
  static const std::vector<Asset> table = make_table();
  return table;
}

const Asset* find_asset(std::string_view path) {
  for (const Asset& a : assets())
    if (a.path == path) return &a;
  return nullptr;
}

std::string_view bundle_hash() { return detail::kBundle; }

}  // namespace nshpc::dashboard
