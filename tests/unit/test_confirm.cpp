// Confirmations of what cannot be undone (tools/confirm.hpp): the signed requestState codec, the
// decision table of confirm() through a RequestContext stub, and delete_instance through a real
// mcp::Session of each era (legacy elicitation/create; 2026-07-28 input_required and its retry).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <fstream>
#include <mutex>
#include <thread>

#include "base/error.hpp"
#include "base/json.hpp"
#include "common/temp_dir.hpp"
#include "instances/instances.hpp"
#include "mcp/server.hpp"
#include "tools/confirm.hpp"
#include "tools/internal.hpp"
#include "tools/tools.hpp"

namespace {

namespace sandbox = nshpc::sandbox;
namespace tools = nshpc::tools;
namespace mcp = nshpc::mcp;
using nlohmann::json;
using namespace std::chrono_literals;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

const std::string kKey(32, 'k');

// ---------------------------------------------------------------------------------------------
// The codec.

TEST(ConfirmStates, AStateRedeemsOnceForItsToolAndArguments) {
  tools::ConfirmStates states(kKey);
  const json args = {{"instance_id", "a"}, {"archive_name", ""}};
  const std::string state = states.mint("delete_instance", args);
  ASSERT_TRUE(has(state, ".")) << state;
  EXPECT_EQ(state.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_."),
            std::string::npos)
      << state;
  // The retry may add confirm; the arguments' order does not matter.
  json retry = {{"archive_name", ""}, {"confirm", true}, {"instance_id", "a"}};
  EXPECT_EQ(states.redeem(state, "delete_instance", retry), "");
  EXPECT_EQ(states.redeem(state, "delete_instance", args), "already used");
}

TEST(ConfirmStates, ATamperedStateIsRefused) {
  tools::ConfirmStates states(kKey);
  const json args = {{"instance_id", "a"}};
  const std::string state = states.mint("delete_instance", args);
  const std::size_t dot = state.find('.');
  std::string body_changed = state;
  body_changed[dot / 2] = body_changed[dot / 2] == 'A' ? 'B' : 'A';
  EXPECT_EQ(states.redeem(body_changed, "delete_instance", args), "its signature does not match");
  std::string mac_changed = state;
  mac_changed[state.size() - 2] = mac_changed[state.size() - 2] == 'A' ? 'B' : 'A';
  EXPECT_EQ(states.redeem(mac_changed, "delete_instance", args), "its signature does not match");
  EXPECT_EQ(states.redeem(state.substr(0, dot), "delete_instance", args), "not a state this server made");
  EXPECT_EQ(states.redeem(state + "=", "delete_instance", args), "its signature does not match");
  EXPECT_EQ(states.redeem(std::string(5000, 'a'), "delete_instance", args), "too long");
  // Another server's key signs states this one does not take.
  tools::ConfirmStates other(std::string(32, 'o'));
  EXPECT_EQ(states.redeem(other.mint("delete_instance", args), "delete_instance", args), "its signature does not match");
  // The untouched state still works (the failures used nothing up).
  EXPECT_EQ(states.redeem(state, "delete_instance", args), "");
}

TEST(ConfirmStates, AStateForAnotherCallOrPastItsLifetimeIsRefused) {
  tools::ConfirmStates states(kKey);
  const json args = {{"instance_id", "a"}};
  EXPECT_EQ(states.redeem(states.mint("delete_instance", args), "delete_instance", {{"instance_id", "b"}}),
            "made for another call");
  EXPECT_EQ(states.redeem(states.mint("delete_instance", args), "computer_delete", args), "made for another call");
  const auto now = tools::ConfirmStates::Clock::now();
  const std::string old = states.mint("delete_instance", args, now - tools::ConfirmStates::kLifetime - 2s);
  EXPECT_EQ(states.redeem(old, "delete_instance", args, now), "expired");
  const std::string fresh = states.mint("delete_instance", args, now - tools::ConfirmStates::kLifetime + 5s);
  EXPECT_EQ(states.redeem(fresh, "delete_instance", args, now), "");
}

TEST(ConfirmStates, TheKeyIsMadeOnceAndKeptPrivate) {
  nshpc::tests::TempDir tmp;
  const auto file = tmp.path() / "state" / "confirm-key";
  const std::string key = tools::ConfirmStates::load_key(file);
  EXPECT_EQ(key.size(), 32u);
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(tools::ConfirmStates::load_key(file), key);  // a restart signs with the same key
  ::chmod(file.c_str(), 0644);
  try {
    tools::ConfirmStates::load_key(file);
    ADD_FAILURE() << "a key readable by others was used";
  } catch (const nshpc::Error& e) {
    EXPECT_TRUE(has(e.what(), "readable by other users")) << e.what();
  }
}

TEST(ConfirmationRequest, IsAFormWithOneRequiredBoolean) {
  const json r = tools::confirmation_request("Delete instance 'a'?");
  EXPECT_EQ(r["mode"], "form");
  EXPECT_EQ(r["message"], "Delete instance 'a'?");
  EXPECT_EQ(r["requestedSchema"]["required"], json::array({"confirm"}));
  EXPECT_EQ(r["requestedSchema"]["properties"]["confirm"]["type"], "boolean");
  EXPECT_TRUE(tools::accepts({{"action", "accept"}, {"content", {{"confirm", true}}}}));
  EXPECT_FALSE(tools::accepts({{"action", "accept"}, {"content", {{"confirm", false}}}}));
  EXPECT_FALSE(tools::accepts({{"action", "accept"}, {"content", {{"confirm", "true"}}}}));
  EXPECT_FALSE(tools::accepts({{"action", "accept"}}));
  EXPECT_FALSE(tools::accepts({{"action", "decline"}, {"content", {{"confirm", true}}}}));
  EXPECT_FALSE(tools::accepts({{"action", "cancel"}}));
  EXPECT_FALSE(tools::accepts("accept"));
}

// ---------------------------------------------------------------------------------------------
// confirm()'s decision table.

// Runs nothing; no instance here ever lives.
class IdleBackend final : public sandbox::Backend {
 public:
  std::string_view name() const override { return "idle"; }
  std::unique_ptr<sandbox::Process> start(const sandbox::RunSpec&) override { throw nshpc::Error("idle: no runs"); }
  sandbox::LivingStatus living_status(const sandbox::Target&) override { return {}; }
  sandbox::LivingStatus start_living(const sandbox::Target&) override { throw nshpc::Error("idle: no runs"); }
  bool change_network(const sandbox::Target&) override { return false; }
  bool stop_living(const sandbox::Target&, std::string_view, std::chrono::milliseconds) override { return false; }
  std::vector<sandbox::LivingProcess> living_processes(const sandbox::Target&) override { return {}; }
  bool commands_share_pids() const override { return true; }
  std::vector<std::string> end_stray_sandboxes(const std::filesystem::path&) override { return {}; }
  std::vector<std::string> describe(const sandbox::RunSpec&) const override { return {}; }
};

class Stub final : public mcp::RequestContext {
 public:
  mcp::Era era_ = mcp::Era::modern;
  json caps = json::object();
  json responses = json::object();
  std::string state;
  std::optional<json> client_answer;  // legacy: what elicitation/create returns; unset: it fails
  std::vector<json> asked;            // legacy: the elicitation/create params sent

  bool cancelled() const override { return false; }
  bool wait_cancelled_for(std::chrono::milliseconds) const override { return false; }
  void progress(double, std::optional<double>, const std::string&) override {}
  void log(mcp::LogLevel, const json&, const std::string&) override {}
  mcp::Era era() const override { return era_; }
  const std::string& protocol_version() const override { return version_; }
  std::string client_name() const override { return "unit/1"; }
  const std::string& session_id() const override { return session_; }
  json client_capabilities() const override { return caps; }
  const std::string& traceparent() const override { return empty_; }
  const std::string& tracestate() const override { return empty_; }
  const json& input_responses() const override { return responses; }
  const std::string& request_state() const override { return state; }
  TaskMode task_mode() const override { return TaskMode::none; }
  std::optional<std::int64_t> requested_task_ttl() const override { return std::nullopt; }
  json request_client(const std::string& method, json params, std::chrono::milliseconds) override {
    EXPECT_EQ(method, "elicitation/create");
    asked.push_back(params);
    if (!client_answer) throw mcp::ProtocolError(mcp::kInternalError, "the client did not answer elicitation/create");
    return *client_answer;
  }

 private:
  std::string version_ = "2026-07-28", session_ = "s1", empty_;
};

class ConfirmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.ns.instances_dir = tmp_.path() / "instances";
    config_.server.state_dir = tmp_.path() / "state";
    config_.ns.sandbox_uid = static_cast<uint32_t>(::getuid());
    config_.ns.sandbox_gid = static_cast<uint32_t>(::getgid());
    config_.ns.idle_stop = 900;
    config_.mcp.confirm_destructive = true;
    instances_ = std::make_unique<nshpc::instances::Service>(config_, std::make_unique<IdleBackend>());
  }
  // One server's context: its copies share the server's confirmation signer (used nonces).
  tools::ToolContext ctx() {
    tools::ToolContext c{tools::Services{config_, *instances_, nullptr, false}};
    c.services.confirmations = signer_;
    return c;
  }
  std::shared_ptr<tools::ConfirmSigner> signer_ = std::make_shared<tools::ConfirmSigner>();
  // The reason of a refusal; "" when confirm() let the action go ahead.
  std::string outcome(Stub& rc, const json& args, tools::ConfirmedBy* how = nullptr) {
    try {
      const tools::ConfirmedBy by = tools::confirm(ctx(), rc, "delete_instance", args, "Delete instance 'a'?");
      if (how) *how = by;
      return "";
    } catch (const nshpc::UsageError& e) {
      return e.what();
    }
  }
  std::vector<json> confirmations() {
    std::vector<json> out;
    std::ifstream in(config_.ns.instances_dir / ".audit.log");
    for (std::string line; std::getline(in, line);)
      if (json j = nshpc::parse_json(line); j["event"] == "mcp.confirmed") out.push_back(j);
    return out;
  }

  nshpc::tests::TempDir tmp_;
  nshpc::config::Config config_;
  std::unique_ptr<nshpc::instances::Service> instances_;
};

const json kArgs = {{"instance_id", "a"}};
const json kYes = {{"action", "accept"}, {"content", {{"confirm", true}}}};

TEST_F(ConfirmTest, OffGoesAheadWithoutAsking) {
  config_.mcp.confirm_destructive = false;
  Stub rc;
  rc.caps = {{"elicitation", json::object()}};
  tools::ConfirmedBy how{};
  EXPECT_EQ(outcome(rc, kArgs, &how), "");
  EXPECT_EQ(how, tools::ConfirmedBy::not_asked);
  EXPECT_TRUE(confirmations().empty());
}

TEST_F(ConfirmTest, ConfirmTrueGoesAheadAndIsAudited) {
  Stub rc;
  rc.caps = {{"elicitation", json::object()}};  // even a client that could be asked
  tools::ConfirmedBy how{};
  EXPECT_EQ(outcome(rc, {{"instance_id", "a"}, {"confirm", true}}, &how), "");
  EXPECT_EQ(how, tools::ConfirmedBy::argument);
  const auto lines = confirmations();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(has(lines[0].dump(), "\"confirmed_by\":\"confirm_argument\"")) << lines[0].dump();
  EXPECT_TRUE(has(lines[0].dump(), "\"instance_id\":\"a\"")) << lines[0].dump();
}

TEST_F(ConfirmTest, AClientThatCannotBeAskedIsToldToPassConfirm) {
  for (mcp::Era era : {mcp::Era::legacy, mcp::Era::modern}) {
    Stub rc;
    rc.era_ = era;
    rc.caps = {{"sampling", json::object()}, {"elicitation", {{"url", json::object()}}}};  // no form mode
    const std::string why = outcome(rc, {{"instance_id", "a"}, {"confirm", false}});
    EXPECT_TRUE(has(why, "Delete instance 'a'? This cannot be undone; ask the user, then call again with confirm: true"))
        << why;
    EXPECT_TRUE(rc.asked.empty());
  }
  EXPECT_TRUE(confirmations().empty());
}

TEST_F(ConfirmTest, LegacyAsksWithElicitation) {
  Stub rc;
  rc.era_ = mcp::Era::legacy;
  rc.caps = {{"elicitation", {{"form", json::object()}}}};
  rc.client_answer = kYes;
  tools::ConfirmedBy how{};
  EXPECT_EQ(outcome(rc, kArgs, &how), "");
  EXPECT_EQ(how, tools::ConfirmedBy::elicitation);
  ASSERT_EQ(rc.asked.size(), 1u);
  EXPECT_EQ(rc.asked[0], tools::confirmation_request("Delete instance 'a'?"));

  rc.client_answer = json{{"action", "decline"}};
  EXPECT_TRUE(has(outcome(rc, kArgs), "not done: the user declined (decline): Delete instance 'a'?"));
  rc.client_answer = json{{"action", "cancel"}};
  EXPECT_TRUE(has(outcome(rc, kArgs), "not done: the user declined (cancel)"));
  rc.client_answer = json{{"action", "accept"}, {"content", {{"confirm", false}}}};
  EXPECT_TRUE(has(outcome(rc, kArgs), "not done: the user declined (accept)"));
  rc.client_answer.reset();
  EXPECT_TRUE(has(outcome(rc, kArgs), "not done: the confirmation was not answered"));
  ASSERT_EQ(confirmations().size(), 1u);
  EXPECT_TRUE(has(confirmations()[0].dump(), "\"confirmed_by\":\"elicitation\""));
}

TEST_F(ConfirmTest, ModernAsksWithInputRequiredAndReadsTheRetry) {
  Stub rc;
  rc.caps = {{"elicitation", json::object()}};
  std::string state;
  try {
    tools::confirm(ctx(), rc, "delete_instance", kArgs, "Delete instance 'a'?");
    FAIL() << "no input_required";
  } catch (const mcp::InputRequired& ir) {
    EXPECT_EQ(ir.requests, (json{{"confirm", {{"method", "elicitation/create"},
                                              {"params", tools::confirmation_request("Delete instance 'a'?")}}}}));
    state = ir.state;
  }
  ASSERT_FALSE(state.empty());
  // A retry with the state but without the answer is asked again, with a new state.
  Stub again = rc;
  again.state = state;
  std::string second;
  try {
    tools::confirm(ctx(), again, "delete_instance", kArgs, "Delete instance 'a'?");
    FAIL() << "no input_required";
  } catch (const mcp::InputRequired& ir) {
    second = ir.state;
  }
  EXPECT_NE(second, state);
  // The answer with the state: yes.
  Stub yes = rc;
  yes.state = second;
  yes.responses = {{"confirm", kYes}};
  tools::ConfirmedBy how{};
  EXPECT_EQ(outcome(yes, kArgs, &how), "");
  EXPECT_EQ(how, tools::ConfirmedBy::input_required);
  // The same state again: replayed.
  EXPECT_TRUE(has(outcome(yes, kArgs), "refused: the confirmation's state was altered or already used (already used)"));
  // The original state was used by the retry without an answer.
  Stub first = yes;
  first.state = state;
  EXPECT_TRUE(has(outcome(first, kArgs), "already used"));
  // An answer with a state of its own making.
  Stub forged = yes;
  forged.state = "eyJ0IjoiZGVsZXRlX2luc3RhbmNlIn0.AAAA";
  EXPECT_TRUE(has(outcome(forged, kArgs), "refused: the confirmation's state was altered"));
  // No.
  std::string third;
  try {
    tools::confirm(ctx(), rc, "delete_instance", kArgs, "Delete instance 'a'?");
  } catch (const mcp::InputRequired& ir) {
    third = ir.state;
  }
  Stub no = rc;
  no.state = third;
  no.responses = {{"confirm", {{"action", "decline"}}}};
  EXPECT_TRUE(has(outcome(no, kArgs), "not done: the user declined (decline)"));
  ASSERT_EQ(confirmations().size(), 1u);
  EXPECT_TRUE(has(confirmations()[0].dump(), "\"confirmed_by\":\"input_required\""));
}

// ---------------------------------------------------------------------------------------------
// delete_instance through a real mcp::Session of each era.

// A client on one session: requests answered on threads of their own (a handler may wait for the
// client's answer to elicitation/create), every message the server sends kept.
class Wire {
 public:
  explicit Wire(mcp::Server& server, std::string id) {
    session_ = std::make_unique<mcp::Session>(
        server, std::move(id),
        [this](const json& m) {
          std::lock_guard lock(mu_);
          messages_.push_back(m);
          cv_.notify_all();
        },
        [this](std::function<void()> work) {
          std::lock_guard lock(mu_);
          workers_.emplace_back(std::move(work));
        });
  }
  ~Wire() {
    session_.reset();
    std::vector<std::thread> workers;
    {
      std::lock_guard lock(mu_);
      workers.swap(workers_);
    }
    for (auto& w : workers) w.join();
  }
  void send(const json& message) { session_->receive(message.dump()); }
  json request(int id, const std::string& method, json params) {
    send({{"jsonrpc", "2.0"}, {"id", id}, {"method", method}, {"params", std::move(params)}});
    return wait([&](const json& m) { return m.contains("id") && m["id"] == id && !m.contains("method"); });
  }
  // The first message `pred` accepts (waiting up to 10 s for it).
  json wait(const std::function<bool(const json&)>& pred) {
    std::unique_lock lock(mu_);
    json found;
    cv_.wait_for(lock, 10s, [&] {
      for (const auto& m : messages_)
        if (pred(m)) {
          found = m;
          return true;
        }
      return false;
    });
    EXPECT_FALSE(found.is_null()) << "no such message from the server";
    return found;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<json> messages_;
  std::vector<std::thread> workers_;
  std::unique_ptr<mcp::Session> session_;
};

class ConfirmSessionTest : public ConfirmTest {
 protected:
  void SetUp() override {
    ConfirmTest::SetUp();
    const tools::Services services{config_, *instances_, nullptr, /*job_tools=*/false};
    server_ = std::make_unique<mcp::Server>(tools::server_info(), tools::server_options(config_, services));
    tools::register_all(*server_, services);
    for (const char* id : {"a", "b", "c", "d"}) instances_->create(id, nshpc::store::CreateOptions{}, "test");
  }
  bool exists(const std::string& id) { return instances_->store().exists(id); }
  static std::string text(const json& response) {
    const json& r = response["result"];
    return r.contains("content") && !r["content"].empty() ? r["content"][0].value("text", "") : "";
  }
  std::unique_ptr<mcp::Server> server_;
};

json legacy_init(Wire& w, json caps) {
  json r = w.request(1, "initialize", {{"protocolVersion", "2025-11-25"},
                                       {"capabilities", std::move(caps)},
                                       {"clientInfo", {{"name", "unit"}, {"version", "1"}}}});
  w.send({{"jsonrpc", "2.0"}, {"method", "notifications/initialized"}});
  return r;
}

TEST_F(ConfirmSessionTest, LegacyClientWithElicitationIsAskedYesDeletesNoKeeps) {
  Wire w(*server_, "s1");
  legacy_init(w, {{"elicitation", json::object()}});
  const auto answer = [&](int call, const std::string& id, json result) {
    w.send({{"jsonrpc", "2.0"},
            {"id", call},
            {"method", "tools/call"},
            {"params", {{"name", "delete_instance"}, {"arguments", {{"instance_id", id}}}}}});
    const json ask = w.wait([&](const json& m) {
      return m.value("method", "") == "elicitation/create" &&
             has(m["params"].value("message", ""), "'" + id + "'");
    });
    EXPECT_EQ(ask["params"]["requestedSchema"]["required"], json::array({"confirm"})) << ask.dump();
    w.send({{"jsonrpc", "2.0"}, {"id", ask["id"]}, {"result", std::move(result)}});
    return w.wait([&](const json& m) { return m.contains("id") && m["id"] == call && !m.contains("method"); });
  };
  const json yes = answer(2, "a", kYes);
  EXPECT_FALSE(yes["result"].value("isError", false)) << yes.dump();
  EXPECT_FALSE(exists("a"));
  const json no = answer(3, "b", {{"action", "decline"}});
  EXPECT_TRUE(no["result"].value("isError", false)) << no.dump();
  EXPECT_TRUE(has(text(no), "not done: the user declined")) << no.dump();
  EXPECT_TRUE(exists("b"));
}

json modern_call(const std::string& id, json caps, json extra = json::object()) {
  json params = {{"name", "delete_instance"},
                 {"arguments", {{"instance_id", id}}},
                 {"_meta", {{"io.modelcontextprotocol/protocolVersion", "2026-07-28"},
                            {"io.modelcontextprotocol/clientInfo", {{"name", "unit"}, {"version", "2"}}},
                            {"io.modelcontextprotocol/clientCapabilities", std::move(caps)}}}};
  params.update(extra);
  return params;
}

TEST_F(ConfirmSessionTest, ModernClientRetriesWithTheAnswerAndTheSignedState) {
  Wire w(*server_, "stdio");
  const json caps = {{"elicitation", json::object()}};
  int next = 1;
  const auto first_round = [&](const std::string& id) {
    const json r = w.request(next++, "tools/call", modern_call(id, caps));
    EXPECT_EQ(r["result"]["resultType"], "input_required") << r.dump();
    EXPECT_EQ(r["result"]["inputRequests"]["confirm"]["method"], "elicitation/create") << r.dump();
    EXPECT_TRUE(has(r["result"]["inputRequests"]["confirm"]["params"].value("message", ""), "'" + id + "'"));
    EXPECT_TRUE(exists(id));
    return r["result"].value("requestState", "");
  };
  const auto retry = [&](const std::string& id, const std::string& state, const json& answer) {
    return w.request(next++, "tools/call",
                     modern_call(id, caps, {{"inputResponses", {{"confirm", answer}}}, {"requestState", state}}));
  };
  // Yes: deleted.
  const std::string state_a = first_round("a");
  const json yes = retry("a", state_a, kYes);
  EXPECT_FALSE(yes["result"].value("isError", false)) << yes.dump();
  EXPECT_FALSE(exists("a"));
  // No: kept.
  const json no = retry("b", first_round("b"), {{"action", "decline"}});
  EXPECT_TRUE(has(text(no), "not done: the user declined")) << no.dump();
  EXPECT_TRUE(exists("b"));
  // A state altered in transit: refused, kept.
  std::string forged = first_round("c");
  forged[forged.size() / 3] = forged[forged.size() / 3] == 'x' ? 'y' : 'x';
  const json tampered = retry("c", forged, kYes);
  EXPECT_TRUE(has(text(tampered), "refused: the confirmation's state was altered or already used")) << tampered.dump();
  EXPECT_TRUE(exists("c"));
  // a's state for c: made for another call.
  const json moved = retry("c", state_a, kYes);
  EXPECT_TRUE(has(text(moved), "refused")) << moved.dump();
  EXPECT_TRUE(exists("c"));
  // Replayed: d's state used for a "no", then again with a "yes".
  const std::string state_d = first_round("d");
  EXPECT_TRUE(has(text(retry("d", state_d, {{"action", "cancel"}})), "not done"));
  const json replay = retry("d", state_d, kYes);
  EXPECT_TRUE(has(text(replay), "already used")) << replay.dump();
  EXPECT_TRUE(exists("d"));
}

TEST_F(ConfirmSessionTest, AClientWithNeitherIsToldToPassConfirmAndThenSucceeds) {
  Wire legacy(*server_, "s1");
  legacy_init(legacy, json::object());
  const json told = legacy.request(2, "tools/call", {{"name", "delete_instance"}, {"arguments", {{"instance_id", "a"}}}});
  EXPECT_TRUE(has(text(told), "cannot be undone; ask the user, then call again with confirm: true")) << told.dump();
  EXPECT_TRUE(exists("a"));
  const json done = legacy.request(
      3, "tools/call", {{"name", "delete_instance"}, {"arguments", {{"instance_id", "a"}, {"confirm", true}}}});
  EXPECT_FALSE(done["result"].value("isError", false)) << done.dump();
  EXPECT_FALSE(exists("a"));

  Wire modern(*server_, "stdio");
  const json told2 = modern.request(1, "tools/call", modern_call("b", json::object()));
  EXPECT_TRUE(has(text(told2), "call again with confirm: true")) << told2.dump();
  EXPECT_TRUE(exists("b"));
  json with = modern_call("b", json::object());
  with["arguments"]["confirm"] = true;
  const json done2 = modern.request(2, "tools/call", with);
  EXPECT_FALSE(done2["result"].value("isError", false)) << done2.dump();
  EXPECT_FALSE(exists("b"));
  const auto lines = confirmations();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_TRUE(has(lines[1].dump(), "\"confirmed_by\":\"confirm_argument\""));
}

TEST_F(ConfirmSessionTest, OffNothingIsAsked) {
  config_.mcp.confirm_destructive = false;
  Wire w(*server_, "stdio");
  const json r = w.request(1, "tools/call", modern_call("a", {{"elicitation", json::object()}}));
  EXPECT_FALSE(r["result"].value("isError", false)) << r.dump();
  EXPECT_NE(r["result"].value("resultType", ""), "input_required");
  EXPECT_FALSE(exists("a"));
}

}  // namespace
