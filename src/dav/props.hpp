// Dead properties (PROPPATCH), kept by the server in an SQLite file of its state folder — never
// in a folder a sandbox can write — keyed by the resource's decoded URL path, and carried along
// by COPY and MOVE and dropped by DELETE.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dav/xml.hpp"

namespace nshpc::dav {

struct DeadProperty {
  xml::Name name;
  std::string value_xml;  // the content as XML (xml::inner_xml)
  std::string lang;
};

// One change of a PROPPATCH, applied in document order.
struct PropChange {
  bool remove = false;
  DeadProperty property;
};

class PropStore {
 public:
  // Opens (creating) the database file; throws Error naming it when it cannot.
  explicit PropStore(const std::filesystem::path& file);
  ~PropStore();
  PropStore(const PropStore&) = delete;
  PropStore& operator=(const PropStore&) = delete;

  std::vector<DeadProperty> get(const std::string& path);
  // The properties of every member of the collection `path` (one query for a whole listing),
  // by member path.
  std::map<std::string, std::vector<DeadProperty>> get_members(const std::string& path);
  // All changes in one transaction.
  void apply(const std::string& path, const std::vector<PropChange>& changes);
  // `from` and everything under it, to `to` (replacing what `to` had).
  void copy_tree(const std::string& from, const std::string& to);
  void move_tree(const std::string& from, const std::string& to);
  void remove_tree(const std::string& path);

  struct Db;  // the connection (props.cpp)

 private:
  std::mutex mutex_;
  std::unique_ptr<Db> db_;
};

}  // namespace nshpc::dav
