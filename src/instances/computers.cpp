#include "instances/computers.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <random>
#include <ctime>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/text.hpp"
#include "base/fd.hpp"
#include "base/fs.hpp"
#include "base/log.hpp"
#include "base/proc.hpp"
#include "instances/instances.hpp"

namespace nshpc::instances {

namespace {

namespace stdfs = std::filesystem;

constexpr std::array<std::string_view, 12> kAdjectives = {"amber", "brisk", "calm",  "clever", "coral",  "crisp",
                                                          "gentle", "lucky", "quiet", "rapid",  "silver", "steady"};
constexpr std::array<std::string_view, 12> kNouns = {"badger", "comet", "falcon", "gecko", "heron", "lynx",
                                                     "otter",  "panda", "raven",  "tiger", "whale", "wolf"};

bool slug_char(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; }

// A bool as the seed's messages print it (str(value).lower()).
const char* lower(bool value) { return value ? "true" : "false"; }

stdfs::path owners_dir(const store::Instance& inst) { return inst.base / "owners"; }

}  // namespace

bool is_computer_id(std::string_view id) {
  return !id.empty() && id.size() <= 63 && std::all_of(id.begin(), id.end(), slug_char) && id.front() != '-' &&
         id.back() != '-';
}

std::string validate_computer_id(std::string_view id) {
  const std::string_view value = text::trim(id, kPythonSpace);
  if (!is_computer_id(value)) throw UsageError(std::string(kComputerIdRule));
  return std::string(value);
}

std::string random_computer_id() {
  std::random_device source;
  std::uniform_int_distribution<std::size_t> word(0, kAdjectives.size() - 1);
  std::uniform_int_distribution<unsigned> hex(0, 0xffff);
  return fmt::format("{}-{}-{:04x}", kAdjectives[word(source)], kNouns[word(source)], hex(source));
}

std::string owner_key(std::string_view session) {
  std::string safe;
  for (char c : session.substr(0, 64))
    safe += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '_';
  const pid_t pid = ::getpid();
  const std::optional<proc::Stat> self = proc::read_stat(pid);
  return fmt::format("{}.{}.{}", pid, self ? self->start_time : 0, safe.empty() ? "_" : safe);
}

bool owner_alive(std::string_view key) {
  const auto dot = key.find('.');
  const auto dot2 = dot == std::string_view::npos ? dot : key.find('.', dot + 1);
  if (dot2 == std::string_view::npos) return false;
  pid_t pid = 0;
  std::uint64_t start = 0;
  if (std::from_chars(key.data(), key.data() + dot, pid).ec != std::errc() || pid <= 0) return false;
  if (std::from_chars(key.data() + dot + 1, key.data() + dot2, start).ec != std::errc()) return false;
  // A crashed server that nobody reaps stays a zombie with its pid and start time: it holds nothing.
  const std::optional<proc::Stat> owner = proc::read_stat(pid);
  return start != 0 && owner && owner->start_time == start && !owner->ended();
}

namespace {
constexpr std::string_view kLeaseSuffix = ".~lease";

// A lease holds until its record's mtime (the expiry its last renewal set).
bool lease_running(const stdfs::path& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return false;
  struct timespec now {};
  ::clock_gettime(CLOCK_REALTIME, &now);
  return st.st_mtim.tv_sec > now.tv_sec || (st.st_mtim.tv_sec == now.tv_sec && st.st_mtim.tv_nsec > now.tv_nsec);
}

// Sets the lease's expiry: `lease` from now.
void set_lease_expiry(const stdfs::path& file, std::chrono::seconds lease) {
  struct timespec now {};
  ::clock_gettime(CLOCK_REALTIME, &now);
  const struct timespec until = {now.tv_sec + static_cast<time_t>(lease.count()), now.tv_nsec};
  const std::array<struct timespec, 2> times = {until, until};
  if (::utimensat(AT_FDCWD, file.c_str(), times.data(), AT_SYMLINK_NOFOLLOW) != 0)
    throw SysError(errno, "set the lease's expiry (utimensat)", file.string());
}
}  // namespace

std::string lease_key() {
  std::string key = owner_key("x");
  key.resize(key.size() - 2);  // "<pid>.<start time>"
  return key + std::string(kLeaseSuffix);
}

bool is_lease_key(std::string_view key) { return key.ends_with(kLeaseSuffix); }

nlohmann::json to_json(const ComputerInfo& info) {
  nlohmann::json out = {{"computer_id", info.computer_id},
                        {"temporary", info.temporary},
                        {"state", info.state},
                        {"root", info.root},
                        {"created_at", info.created_at},
                        {"network", std::string(config::to_string(info.network))},
                        {"network_access", info.network != config::Network::off}};
  if (info.temporary) out["sessions"] = info.holders;
  return out;
}

Computers::Computers(Service& instances, std::string image, std::chrono::seconds lease)
    : instances_(instances), store_(instances.store()), image_(std::move(image)), lease_(lease) {}

stdfs::path Computers::lock_file() const { return store_.root() / ".computers.lock"; }

store::Instance Computers::acquire(const std::string& id, bool temporary, config::Network network,
                                   std::string_view owner, std::string_view actor, bool* created, bool desktop) {
  validate_computer_id(id);
  fs::make_dirs(store_.root(), 0711);
  fs::FileLock lock(lock_file());
  if (created) *created = false;
  store::Instance inst;
  if (store_.exists(id)) {
    inst = store_.get(id);
    const std::optional<bool> was = inst.meta.computer_temporary();
    if (!was)
      throw UsageError(fmt::format(
          "'{}' is an ns-hpc instance that is not a computer: a computer is made by this entry point on the image "
          "'{}' and never stops for idleness. Choose another computer_id (that instance is served by ns-hpc's "
          "instance tools)",
          id, image_));
    if (*was != temporary && held(id))
      throw UsageError(fmt::format(
          "Computer '{}' already exists with temporary={}; lifecycle mode cannot be changed without a factory reset "
          "or delete.",
          id, lower(*was)));
    if (*was != temporary)
      throw UsageError(fmt::format("Computer '{}' already exists with temporary={}; requested temporary={}.", id,
                                   lower(*was), lower(temporary)));
  } else {
    if (image_.empty() && !desktop)
      throw UsageError("computers run on [namespace] default_image, which is empty here; set it (for example "
                       "\"debian\") in the config");
    store::CreateOptions options;
    options.description = temporary ? "a temporary computer (mcp-virtual-computer)" : "a computer (mcp-virtual-computer)";
    options.network = network;
    options.image = desktop ? instances_.config().desktop.image : image_;
    options.desktop = desktop;
    options.idle_stop = 0;
    options.computer_temporary = temporary;
    inst = instances_.create(id, options, actor);
    if (created) *created = true;
  }
  if (temporary && !owner.empty()) {
    const stdfs::path dir = owners_dir(inst);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) throw SysError(errno, "mkdir", dir.string());
    const stdfs::path file = dir / std::string(owner);
    UniqueFd fd(::open(file.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd) throw SysError(errno, "create", file.string());
    if (is_lease_key(owner)) set_lease_expiry(file, lease_);
  }
  std::lock_guard held_lock(held_mutex_);
  held_.insert(inst.id);
  if (temporary && is_lease_key(owner)) leased_.insert(inst.id);
  return inst;
}

bool Computers::held(const std::string& id) const {
  std::lock_guard lock(held_mutex_);
  return held_.count(id) > 0;
}

void Computers::forget(const std::string& id) {
  std::lock_guard lock(held_mutex_);
  held_.erase(id);
  leased_.erase(id);
}

bool Computers::renew(const std::string& id) {
  {
    std::lock_guard lock(held_mutex_);
    if (!leased_.count(id)) return false;
  }
  // Under the lock a sweep takes: a lease that is being renewed is never deleted half-way.
  fs::FileLock lock(lock_file());
  if (!store_.exists(id)) return false;
  const stdfs::path file = owners_dir(store_.get(id)) / lease_key();
  if (!lease_running(file)) return false;  // ran out (the timer deletes it) or gone
  set_lease_expiry(file, lease_);
  return true;
}

std::vector<std::string> Computers::expire_leases(std::string_view actor) {
  std::vector<std::string> leased, deleted;
  {
    std::lock_guard lock(held_mutex_);
    leased.assign(leased_.begin(), leased_.end());
  }
  if (leased.empty()) return deleted;
  fs::FileLock lock(lock_file());
  for (const std::string& id : leased) {
    try {
      if (!store_.exists(id)) {
        forget(id);
        continue;
      }
      const store::Instance inst = store_.get(id);
      if (lease_running(owners_dir(inst) / lease_key())) continue;
      if (delete_if_unheld(inst, actor)) {
        deleted.push_back(id);
      } else {
        // Another holder keeps it: this process's lease is over all the same.
        std::lock_guard held_lock(held_mutex_);
        leased_.erase(id);
      }
    } catch (const std::exception& e) {
      log::warn("the temporary computer '{}' was not deleted: {}", id, e.what());
    }
  }
  return deleted;
}

store::Instance Computers::get(const std::string& id) const {
  const std::string name = validate_computer_id(id);
  const auto not_found = [&](std::string message) {
    std::vector<std::string> ids;
    for (const store::Instance& inst : store_.list().instances)
      if (inst.meta.computer_temporary()) ids.push_back(inst.id);
    return NotFound(NotFound::Kind::instance, std::move(message), {.near_miss = text::closest(name, ids).value_or("")});
  };
  if (!store_.exists(name)) throw not_found(fmt::format("Computer '{}' was not found.", name));
  store::Instance inst = store_.get(name);
  if (!inst.meta.computer_temporary())
    throw not_found(
        fmt::format("Computer '{}' was not found. ('{}' is an ns-hpc instance that is not a computer.)", name, name));
  return inst;
}

std::size_t Computers::live_holders(const store::Instance& inst) const {
  std::size_t live = 0;
  std::error_code ec;
  for (const auto& entry : stdfs::directory_iterator(owners_dir(inst), ec)) {
    const std::string name = entry.path().filename().string();
    if (owner_alive(name) && (!is_lease_key(name) || lease_running(entry.path()))) {
      ++live;
    } else {
      ::unlink(entry.path().c_str());
    }
  }
  return live;
}

void Computers::remove_locked(const store::Instance& inst, std::string_view actor) {
  // Its jobs first (the store refuses to delete an instance with live jobs), and its sandbox.
  const Ended ended = instances_.stop(inst, actor);
  for (const std::string& problem : ended.problems) log::warn("computer '{}': job {}", inst.id, problem);
  instances_.remove(inst.id, actor);
  forget(inst.id);
}

bool Computers::delete_if_unheld(const store::Instance& inst, std::string_view actor) {
  if (inst.meta.computer_temporary() != true || live_holders(inst) > 0) return false;
  remove_locked(inst, actor);
  return true;
}

std::vector<std::string> Computers::release(std::string_view owner, std::string_view actor) {
  std::vector<std::string> deleted;
  if (!stdfs::exists(store_.root())) return deleted;  // no computer was ever made here
  fs::FileLock lock(lock_file());
  for (const store::Instance& inst : store_.list().instances) {
    if (!inst.meta.computer_temporary()) continue;
    const stdfs::path file = owners_dir(inst) / std::string(owner);
    if (::unlink(file.c_str()) != 0) continue;  // not a holder of this one
    try {
      if (delete_if_unheld(inst, actor)) deleted.push_back(inst.id);
    } catch (const std::exception& e) {
      log::warn("the temporary computer '{}' was not deleted: {}", inst.id, e.what());
    }
  }
  return deleted;
}

std::vector<std::string> Computers::sweep(std::string_view actor) {
  std::vector<std::string> deleted;
  if (!stdfs::exists(store_.root())) return deleted;
  fs::FileLock lock(lock_file());
  for (const store::Instance& inst : store_.list().instances) {
    try {
      if (delete_if_unheld(inst, actor)) deleted.push_back(inst.id);
    } catch (const std::exception& e) {
      log::warn("the temporary computer '{}' was not deleted: {}", inst.id, e.what());
    }
  }
  return deleted;
}

ComputerInfo Computers::info(const store::Instance& inst) const {
  ComputerInfo info;
  info.computer_id = inst.id;
  info.temporary = inst.meta.computer_temporary().value_or(false);
  info.root = inst.meta.root();
  info.created_at = inst.meta.created_at();
  info.network = inst.network;
  try {
    info.state = instances_.living_status(inst).running ? "running" : "stopped";
  } catch (const std::exception& e) {
    log::warn("computer '{}': living state unknown: {}", inst.id, e.what());
    info.state = "unknown";
  }
  if (info.temporary) info.holders = live_holders(inst);
  return info;
}

std::vector<ComputerInfo> Computers::list() const {
  std::vector<ComputerInfo> out;
  for (const store::Instance& inst : store_.list().instances)
    if (inst.meta.computer_temporary()) out.push_back(info(inst));
  return out;
}

store::Instance Computers::restart(const std::string& id, std::string_view actor) {
  const store::Instance inst = get(id);
  instances_.restart(inst, actor);
  return store_.get(inst.id);
}

store::Instance Computers::factory_reset(const std::string& id, Trash& trash, std::string_view actor) {
  const store::Instance inst = get(id);
  Snapshots snapshots(instances_, trash);
  snapshots.reset(inst, /*include_workspace=*/true, actor);
  instances_.start(store_.get(inst.id), actor);
  return store_.get(inst.id);
}

void Computers::remove(const std::string& id, std::string_view actor) {
  fs::FileLock lock(lock_file());
  remove_locked(get(id), actor);
}

}  // namespace nshpc::instances
