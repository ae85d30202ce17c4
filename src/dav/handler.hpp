// The WebDAV handler at /dav (class 1 and 2, RFC 4918), served by the HTTP transport as a
// streaming route (transport/http.hpp: the request body is pulled, GET answers with sendfile).
//
//   /dav/                                   virtual: "instances" and the extras
//   /dav/instances/                         virtual: the instances (archived ones are not there)
//   /dav/instances/<id>/                    virtual: workspace, output
//   /dav/instances/<id>/workspace/...       the instance's workspace (read-write)
//   /dav/instances/<id>/output/...          its output folder (read-write)
//   /dav/<extra>/...                        [dav.extras.<extra>] path (read-only unless ro = false)
//
// Every file access goes through dav/tree.hpp (beneath a folder descriptor, never following a
// link); files of an instance are written as its sandbox user. Every write of an instance
// (PUT, DELETE, MKCOL, COPY, MOVE, PROPPATCH, and a LOCK that creates a file) is one
// `dav.write` line in its audit log.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "base/users.hpp"
#include "config/config.hpp"
#include "dav/locks.hpp"
#include "dav/props.hpp"
#include "instances/instances.hpp"
#include "transport/http.hpp"

namespace nshpc::dav {

struct DavSettings {
  std::string prefix = "/dav";
  std::map<std::string, config::DavExtra> extras;
  std::filesystem::path props_file;                // the dead-property database
  std::size_t max_listing = 100000;                // entries of one PROPFIND Depth 1 / HTML listing
  std::size_t max_xml_bytes = 1024 * 1024;         // PROPFIND/PROPPATCH/LOCK bodies
};

class DavHandler {
 public:
  // Checks every extra folder (it must exist, be a folder, be readable and traversable) and
  // opens the property database; throws Error naming what is wrong.
  DavHandler(const instances::Service& instances, DavSettings settings);
  ~DavHandler();
  DavHandler(const DavHandler&) = delete;
  DavHandler& operator=(const DavHandler&) = delete;

  // One request. Never throws: every problem is an HTTP status with a sentence.
  transport::StreamResponse handle(const transport::HttpRequest& request, transport::BodyReader& body);

  // The settings a server's configuration asks for (state folder, sandbox uid, extras).
  static DavSettings settings_from(const config::Config& config);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The streaming route for `handler` (shared by the server's connections).
transport::StreamRoute make_route(std::shared_ptr<DavHandler> handler, std::uint64_t max_upload_bytes);

}  // namespace nshpc::dav
