// ns-hpc run: the MCP server, on stdio or HTTP (streamable HTTP, legacy SSE; TCP or a Unix socket).
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "base/error.hpp"
#include "base/fs.hpp"
#include "base/json.hpp"
#include "base/log.hpp"
#include "base/process.hpp"
#include "base/random.hpp"
#include "cli/app.hpp"
#include "cli/serve.hpp"
#include "dav/handler.hpp"
#include "sandbox/limits.hpp"
#include "tools/tools.hpp"
#include "transport/http.hpp"
#include "transport/stdio.hpp"

namespace nshpc::cli {

namespace {

// How often the server reaps what it started and let run (serve()).
constexpr auto kReapEvery = std::chrono::seconds(5);

enum class Transport { stdio, streamable_http, sse };

struct RunArgs {
  std::optional<Transport> transport;  // stdio when not given
  // The HTTP options: given or not (nullopt: [server] in the config decides).
  std::optional<std::string> host;
  std::optional<int> port;
  std::optional<std::string> uds;
  std::optional<std::string> path;
  std::optional<std::string> auth_token;
  bool allow_unauthenticated = false;
  std::vector<std::string> allowed_hosts;
  std::vector<std::string> allowed_origins;
  std::optional<int> session_timeout;
};

// The token kept in <state_dir>/http-token (0600), created on first use.
std::string stored_token(const std::filesystem::path& state_dir, bool& created) {
  const std::filesystem::path file = state_dir / "http-token";
  created = false;
  struct stat st {};
  if (::stat(file.c_str(), &st) == 0) {
    if ((st.st_mode & 077) != 0)
      throw Error(fmt::format("{} is readable by other users (mode {:o}); run 'chmod 600 {}' or delete it to get a "
                              "new token",
                              file.string(), st.st_mode & 0777, file.string()));
    std::ifstream in(file);
    std::string token;
    std::getline(in, token);
    while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
    if (token.size() >= 16) return token;
    log::warn("{} holds no usable token (fewer than 16 characters): a new one is generated", file.string());
  }
  fs::make_dirs(state_dir, 0711);  // the token is 0600; the instances may be inside (as root by default)
  std::string token = random::hex(32);
  fs::atomic_write(file, token + "\n", 0600);
  created = true;
  return token;
}

// What `run` serves: every tool, the resources and prompts.
ServerParts run_parts() {
  ServerParts parts;
  parts.info = tools::server_info();
  parts.options = [](const tools::Services& services) { return tools::server_options(services.config, services); };
  parts.register_tools = [](mcp::Server& server, const tools::Services& services) { tools::register_all(server, services); };
  return parts;
}

void run_http(Invocation& inv, const RunArgs& a) {
  const config::Config& cfg = inv.config();
  raise_open_file_limit();
  transport::HttpOptions options = http_options(cfg);
  const bool sse = a.transport == Transport::sse;
  options.protocol = sse ? transport::HttpOptions::Protocol::legacy_sse : transport::HttpOptions::Protocol::streamable;
  options.host = a.host.value_or(cfg.server.host);
  options.port = static_cast<std::uint16_t>(a.port.value_or(cfg.server.port));
  options.uds = a.uds.value_or(std::string());
  options.path = a.path.value_or(cfg.server.path);
  if (options.path.empty() || options.path.front() != '/')
    throw Error(fmt::format("--path {:?}: the HTTP endpoint path must start with /", options.path));
  options.allowed_hosts.insert(options.allowed_hosts.end(), a.allowed_hosts.begin(), a.allowed_hosts.end());
  options.allowed_origins.insert(options.allowed_origins.end(), a.allowed_origins.begin(), a.allowed_origins.end());
  if (a.session_timeout) options.session_idle_timeout = std::chrono::seconds(*a.session_timeout);

  // The token: --auth-token, NS_HPC_AUTH_TOKEN, [server] auth_token; otherwise, on loopback or
  // a Unix socket, the one kept in the state folder (generated once).
  std::string token;
  std::string source;
  if (a.auth_token && !a.auth_token->empty()) {
    token = *a.auth_token;
    source = "--auth-token";
  } else if (const char* env = std::getenv("NS_HPC_AUTH_TOKEN"); env && *env) {
    token = env;
    source = "NS_HPC_AUTH_TOKEN";
  } else if (!cfg.server.auth_token.empty()) {
    token = cfg.server.auth_token;
    source = "[server] auth_token";
  }
  const bool local = !options.uds.empty() || transport::is_loopback_host(options.host);
  bool generated = false;
  std::string token_file;
  if (token.empty() && !a.allow_unauthenticated) {
    if (!local)
      throw Error(
          "A non-loopback HTTP listener can execute arbitrary sandbox commands. Set NS_HPC_AUTH_TOKEN/--auth-token, "
          "or explicitly pass --allow-unauthenticated-http behind a trusted private network.");
    token = stored_token(cfg.server.state_dir, generated);
    token_file = (cfg.server.state_dir / "http-token").string();
    source = token_file;
  }
  if (!token.empty() && token.size() < 16)
    log::warn("the HTTP token from {} is short ({} characters); use at least 32 random characters", source, token.size());
  options.token = token;

  // WebDAV at /dav: a streaming route next to MCP, behind the same token.
  std::shared_ptr<dav::DavHandler> dav_handler;
  if (cfg.dav.enabled) {
    fs::make_dirs(cfg.server.state_dir, 0711);
    dav_handler = std::make_shared<dav::DavHandler>(inv.instances(), dav::DavHandler::settings_from(cfg));
    options.stream_routes.push_back(dav::make_route(dav_handler, static_cast<std::uint64_t>(cfg.dav.max_upload_bytes)));
  }

  // The dashboard at / and its API at /api/: the token, or the cookie of its one-time login link.
  const std::string login_path = add_dashboard(inv, options, "ns-hpc run");

  const bool show_token = !token_file.empty();
  const std::string transport_name = sse ? "legacy HTTP+SSE" : "streamable HTTP";
  options.on_listening = [&, show_token, sse](const std::string& url) {
    std::string client_url = url;
    nlohmann::json server_entry;
    if (!options.uds.empty()) {
      server_entry = {{"type", "http"}, {"url", "http://localhost" + options.path}, {"socketPath", options.uds}};
    } else {
      server_entry = {{"type", sse ? "sse" : "http"}, {"url", url}};
    }
    if (!token.empty())
      server_entry["headers"] = {{"Authorization", "Bearer " + (show_token ? token : std::string("<your token>"))}};
    const std::string base = options.uds.empty() ? url.substr(0, url.size() - options.path.size()) : "http://localhost";
    std::string text = dashboard_line(options, base, login_path);
    text += fmt::format("ns-hpc: MCP ({}) listening on {}\n", transport_name, client_url);
    if (token.empty())
      text += fmt::format("ns-hpc: warning: serving HTTP without a token (--allow-unauthenticated-http): anyone who can reach {} can run "
                          "commands in every instance\n",
                          url);
    if (!token.empty())
      text += show_token ? fmt::format("ns-hpc: bearer token (kept in {}): {}\n", token_file, token)
                         : fmt::format("ns-hpc: bearer token from {}\n", source);
    if (dav_handler) {
      text += fmt::format("ns-hpc: WebDAV at {}/dav/ (Basic auth: any user name, the token as password)\n", base);
    }
    text += "ns-hpc: MCP client configuration:\n" +
            nlohmann::json{{"mcpServers", {{"ns-hpc", server_entry}}}}.dump() + "\n";
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
  };

  ServerParts parts = run_parts();
  parts.dashboard_base = dashboard_base(options);
  inv.exit_code = serve(inv, parts, [&](mcp::Server& server) { return transport::serve_http(server, options); });
}

void run_stdio(Invocation& inv) {
  transport::StdioOptions options;
  options.max_message_bytes = static_cast<std::size_t>(inv.config().mcp.max_message_bytes);
  log::info("serving MCP on stdio");
  if (inv.config().dav.enabled) log::info("[dav] enabled: WebDAV is served by the HTTP transports only, not on stdio");
  inv.exit_code = serve(inv, run_parts(), [&](mcp::Server& server) { return transport::serve_stdio(server, options); });
}

}  // namespace

int serve(Invocation& inv, const ServerParts& parts, const std::function<int(mcp::Server&)>& transport) {
  const config::Config& cfg = inv.config();
  // Sandbox processes orphaned by bwrap come to us, not to pid 1 (which in containers may
  // never reap them); the job engine and the sandbox backend reap them.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  jobs::Engine& engine = inv.jobs();
  engine.recover();  // jobs left running by an earlier server are watched again
  inv.instances().serving();
  // Nothing runs that no record names: living sandboxes of instances that are gone end here.
  for (const std::string& line : inv.instances().end_strays()) log::warn("{}", line);
  // What it started and let run (a living sandbox's keeper, a network helper) is reaped within
  // seconds of its end, whether or not its instance is used again: a zombie would otherwise stay
  // until then, and go to a PID 1 that may reap nothing when the server ends.
  std::jthread reaper([&instances = inv.instances()](std::stop_token stop) {
    std::mutex mutex;
    std::condition_variable_any wake;
    std::unique_lock lock(mutex);
    while (!stop.stop_requested()) {
      wake.wait_for(lock, stop, kReapEvery, [] { return false; });
      instances.reap_ended();  // once more as the server ends
    }
  });
  // Said once here: an instance's limits this host cannot enforce (describe_instance lists them too).
  for (const std::string& why : sandbox::instance_limits_unenforced(cfg.ns.limits, cfg.jobs.local.use_cgroups))
    log::warn("[namespace] limits: {} (not enforced for any instance)", why);
  // Deletes an earlier run left unfinished, off the start-up path (a big tree must not delay the
  // first answer); joined when the server ends.
  std::jthread finish_deletions([&instances = inv.instances()] {
    try {
      if (const std::size_t finished = instances.finish_deletions())
        log::info("finished {} delete(s) an earlier run left unfinished", finished);
    } catch (const std::exception& e) {
      log::warn("finishing earlier deletes: {}", e.what());
    }
  });
  // The default image, when it is missing, is built in the background: the first instance on it
  // then needs no wait for a build (a minute or two), and create_instance says how far it is.
  // Started by the first tools/call, not here: a client may start a server only to ask
  // server/discover or tools/list (an MCP client in {mode: 'auto'} over stdio does), and that
  // must not cost minutes of CPU.
  sandbox::BackgroundBuilds image_builds(sandbox::ImageStore(cfg.ns.images_dir),
                                         config::self_command(cfg, "for a background image build"));
  std::once_flag image_build_started;
  const auto start_image_build = [&image_builds, &image_build_started, &cfg] {
    std::call_once(image_build_started, [&] {
      if (cfg.ns.default_image.empty()) return;
      try {
        if (!image_builds.images().current(cfg.ns.default_image)) {
          image_builds.start({.name = cfg.ns.default_image});
          log::info("the default image '{}' is not built yet: building it in the background (log: {}/.building/{}.log)",
                    cfg.ns.default_image, cfg.ns.images_dir.string(), cfg.ns.default_image);
        }
      } catch (const std::exception& e) {
        log::warn("the default image '{}' cannot be built in the background: {}", cfg.ns.default_image, e.what());
      }
    });
  };
  const tools::Services services{.config = cfg,
                                 .instances = inv.instances(),
                                 .image_builds = &image_builds,
                                 .dashboard_base = parts.dashboard_base,
                                 .tool_called = start_image_build};
  mcp::Server server(parts.info, parts.options(services));
  parts.register_tools(server, services);
  // A subscribed instance resource hears of its living sandbox starting and stopping.
  std::optional<tools::LivingStateWatch> living_watch;
  if (parts.watch_living) living_watch.emplace(server, services);
  return transport(server);
}


std::string add_dashboard(Invocation& inv, transport::HttpOptions& options, std::string entry_point) {
  const config::Config& cfg = inv.config();
  if (!cfg.dashboard.enabled) return {};
  options.status_board = std::make_shared<transport::HttpStatusBoard>();
  options.login.code = random::hex(16);
  options.login.landing = "/";
  dashboard::Settings settings;
  settings.version = tools::server_info().version;
  settings.entry_point = std::move(entry_point);
  settings.token = options.token;
  settings.http = options.status_board;
  // Doctor's checks as `ns-hpc doctor --json` prints them, in a process of their own: a check
  // forks and probes, which the server's threads must not do in-process.
  settings.doctor = [command = config::self_command(cfg, "for the dashboard's doctor checks")]() {
    std::vector<std::string> argv = command;
    argv.insert(argv.end(), {"doctor", "--json"});
    const CommandResult result = run_command(argv, {}, std::chrono::seconds(120), 4 * 1024 * 1024);
    try {
      return nlohmann::json::parse(result.out);
    } catch (const std::exception&) {
      throw Error(describe_failure(argv, result));
    }
  };
  dashboard::add_routes(options, inv.instances(), std::move(settings));
  return "/login?code=" + options.login.code;
}

std::function<std::optional<std::string>()> dashboard_base(const transport::HttpOptions& options) {
  if (!options.status_board || !options.uds.empty()) return {};
  return [board = options.status_board, path = options.path]() -> std::optional<std::string> {
    const std::string url = board->get().url;
    if (url.empty() || !url.ends_with(path)) return std::nullopt;
    return url.substr(0, url.size() - path.size());
  };
}

std::string dashboard_line(const transport::HttpOptions& options, const std::string& base, const std::string& login_path) {
  if (login_path.empty()) return {};
  if (options.token.empty()) return fmt::format("Dashboard: {}/\n", base);
  return fmt::format("Dashboard: {}{}  (a one-time login link; afterwards log in at {}/login with the token)\n", base,
                     login_path, base);
}

// An HTTP server holds a descriptor per connection: the soft open-file limit goes up to the hard
// one (what the system allows without privileges), so that the connection caps, not the
// default 1024, decide how many clients fit.
void raise_open_file_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max) return;
  const rlim_t before = rl.rlim_cur;
  rl.rlim_cur = rl.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &rl) != 0)
    log::warn("cannot raise the open-file limit from {} to {}: {}", before, rl.rlim_max, std::strerror(errno));
}

transport::HttpOptions http_options(const config::Config& cfg) {
  transport::HttpOptions options;
  options.host = cfg.server.host;
  options.port = static_cast<std::uint16_t>(cfg.server.port);
  options.path = cfg.server.path;
  options.allowed_hosts = cfg.server.allowed_hosts;
  options.allowed_origins = cfg.server.allowed_origins;
  options.session_idle_timeout = std::chrono::seconds(cfg.server.session_idle_timeout);
  options.max_sessions = static_cast<std::size_t>(cfg.server.max_sessions);
  options.max_body_bytes = static_cast<std::size_t>(cfg.mcp.max_message_bytes);
  options.read_timeout = std::chrono::seconds(cfg.server.read_timeout);
  options.header_timeout = std::chrono::seconds(cfg.server.header_timeout);
  options.shutdown_grace = std::chrono::seconds(cfg.server.shutdown_grace);
  options.sse_buffer_bytes = static_cast<std::size_t>(cfg.server.sse_buffer_bytes);
  options.max_connections = static_cast<std::size_t>(cfg.server.max_connections);
  options.max_connections_per_peer = static_cast<std::size_t>(cfg.server.max_connections_per_peer);
  options.max_sessions_per_peer = static_cast<std::size_t>(cfg.server.max_sessions_per_peer);
  options.max_requests_per_session = static_cast<std::size_t>(cfg.server.max_requests_per_session);
  options.max_requests_per_peer = static_cast<std::size_t>(cfg.server.max_requests_per_peer);
  options.max_session_buffer_bytes = static_cast<std::size_t>(cfg.server.max_session_buffer_bytes);
  options.max_buffer_bytes = static_cast<std::size_t>(cfg.server.max_buffer_bytes);
  return options;
}

void add_run_command(CLI::App& app, Invocation& inv) {
  auto a = std::make_shared<RunArgs>();
  auto* cmd = app.add_subcommand(
      "run",
      "Start the MCP server. stdio by default (point an MCP client's command at 'ns-hpc run'; stdout carries only "
      "MCP messages, logs go to stderr). With --transport streamable-http (or sse for old clients) it serves HTTP on "
      "127.0.0.1:8000/mcp (or a Unix socket) behind a bearer token, printed with a ready-to-paste client "
      "configuration at start-up.");
  add_choice(*cmd, "-t,--transport", a->transport,
             Choices<Transport>{{"stdio", Transport::stdio},
                                {"streamable-http", Transport::streamable_http},
                                {"http", Transport::streamable_http},
                                {"sse", Transport::sse}},
             "stdio (default), streamable-http (alias http) or sse (legacy)");
  // Everything of the HTTP server, in one group: refused together in stdio mode.
  auto* http = cmd->add_option_group("HTTP", "With --transport streamable-http or sse");
  http->add_option("-H,--host", a->host, "HTTP listen address (default [server] host: 127.0.0.1)");
  http->add_option("-p,--port", a->port, "HTTP port (default [server] port: 8000; 0 = any free port)")
      ->check(CLI::Range(0, 65535));
  http->add_option("-u,--uds", a->uds, "Unix socket path for HTTP, created 0600 (instead of host/port)");
  http->add_option("--path", a->path, "HTTP endpoint path (default [server] path: /mcp)");
  http->add_option("--auth-token", a->auth_token,
                   "bearer token for every HTTP route but /healthz (better: NS_HPC_AUTH_TOKEN, which ps "
                   "does not show; default: [server] auth_token, else one generated and kept in "
                   "<state_dir>/http-token)");
  http->add_flag("--allow-unauthenticated-http", a->allow_unauthenticated,
                 "serve HTTP without a token unless one is given (needed for a non-loopback listener without a "
                 "token; only behind a trusted private network)");
  http->add_option("--allowed-host", a->allowed_hosts,
                   "a Host name to accept besides localhost/127.0.0.1/[::1] and the listen address "
                   "(repeatable; \"*\" = any)");
  http->add_option("--allowed-origin", a->allowed_origins,
                   "an Origin to accept besides http(s)://<an accepted host> (repeatable)");
  http->add_option("--session-timeout", a->session_timeout,
                   "close HTTP sessions idle for this many seconds (default [server] "
                   "session_idle_timeout: 300)")
      ->check(CLI::Range(1, 31536000));
  cmd->callback([&inv, a, http] {
    if (a->transport.value_or(Transport::stdio) == Transport::stdio) {
      for (const CLI::Option* option : http->get_options())
        if (option->count() > 0)
          throw CLI::ValidationError(option->get_name(),
                                     "only valid with an HTTP transport (--transport streamable-http or sse); in "
                                     "stdio mode there is no HTTP server");
      run_stdio(inv);
      return;
    }
    run_http(inv, *a);
  });
}

}  // namespace nshpc::cli
