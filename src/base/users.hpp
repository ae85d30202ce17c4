#pragma once

#include <sys/types.h>

#include <unistd.h>

#include <optional>
#include <string>

namespace nshpc::users {

// "alice" for the real uid, or "uid 1234" when it has no name.
std::string current_user_name();

// Who did something, for the audit log: "cli:alice".
std::string cli_actor();

struct Identity {
  uid_t uid;
  gid_t gid;
};

// Whom sandboxes run as, and the files made for them belong to, when not this process's own
// uid: the configured sandbox uid/gid (namespace.sandbox_uid/gid) when this process is root and
// that uid is not 0 (bwrap drops to it); nullopt otherwise (unprivileged: bwrap runs as the
// caller). The one place that decides it.
std::optional<Identity> sandbox_owner(uid_t sandbox_uid, gid_t sandbox_gid, bool as_root = ::geteuid() == 0);

// Gives up every capability for good: the bounding set, the ambient, inheritable, permitted and
// effective sets, and no_new_privs. For a helper of the server that keeps its uid (root's files
// stay its own) but handles what a sandbox sends (the network proxy, a port forwarder). Throws
// SysError.
void drop_capabilities();

}  // namespace nshpc::users
