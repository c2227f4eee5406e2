// docker/: the compose file's three servers (images, published ports, credentials,
// healthchecks) and the Dockerfile's package lists, checked without a Docker engine by parsing
// the files (the compose file with yaml-cpp, as Docker reads it: YAML).
#include <yaml-cpp/yaml.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test_paths.hpp"

namespace {

const std::string docker_dir = std::string(DBLOCK_EXAMPLES_SRC) + "/../docker";

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A service's environment, written as a map or as a list of KEY=VALUE.
std::map<std::string, std::string> environment(const YAML::Node& service) {
  std::map<std::string, std::string> env;
  const YAML::Node e = service["environment"];
  if (e.IsMap()) {
    for (const auto& kv : e)
      env[kv.first.as<std::string>()] = kv.second.as<std::string>();
  } else if (e.IsSequence()) {
    for (const auto& item : e) {
      auto s = item.as<std::string>();
      auto eq = s.find('=');
      if (eq != std::string::npos) env[s.substr(0, eq)] = s.substr(eq + 1);
    }
  }
  return env;
}

struct port {
  std::string host_ip;
  int published = 0, target = 0;
};

// Published ports in the short ("[IP:]HOST:CONTAINER") or the long (map) syntax.
std::vector<port> ports(const YAML::Node& service) {
  std::vector<port> out;
  for (const auto& p : service["ports"]) {
    port r;
    if (p.IsMap()) {
      r.target = p["target"].as<int>();
      r.published = p["published"] ? p["published"].as<int>() : 0;
      r.host_ip = p["host_ip"] ? p["host_ip"].as<std::string>() : "";
    } else {
      std::smatch m;
      std::string s = p.as<std::string>();
      if (std::regex_match(s, m, std::regex(R"((?:([0-9.]+):)?(\d+):(\d+)(?:/tcp)?)"))) {
        r.host_ip = m[1];
        r.published = std::stoi(m[2]);
        r.target = std::stoi(m[3]);
      }
    }
    out.push_back(r);
  }
  return out;
}

// The healthcheck's command as one string (it may be a list or a string).
std::string health_test(const YAML::Node& service) {
  const YAML::Node t = service["healthcheck"]["test"];
  if (t.IsScalar()) return t.as<std::string>();
  std::string s;
  for (const auto& part : t)
    s += (s.empty() ? "" : " ") + part.as<std::string>();
  return s;
}

// One Dockerfile instruction per entry (continuation lines joined), comments dropped.
std::vector<std::string> instructions(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line, cur;
  while (std::getline(in, line)) {
    auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    bool more = !line.empty() && line.back() == '\\';
    if (more) line.pop_back();
    cur += line + " ";
    if (!more) {
      out.push_back(cur);
      cur.clear();
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

struct stage {
  std::string from;
  std::set<std::string> packages;  // every `apt-get install` of the stage
  std::vector<std::string> lines;
};

std::vector<stage> stages(const std::string& dockerfile) {
  std::vector<stage> out;
  for (const auto& ins : instructions(dockerfile)) {
    std::istringstream words(ins);
    std::string word;
    words >> word;
    if (word == "FROM") {
      out.emplace_back();
      words >> out.back().from;
      continue;
    }
    if (out.empty()) continue;
    out.back().lines.push_back(ins);
    if (word != "RUN") continue;
    bool installing = false;
    std::string prev;
    while (words >> word) {
      if (word == "&&" || word == ";" || word == "|") installing = false;
      if (installing && word[0] != '-') out.back().packages.insert(word);
      if (prev == "apt-get" && word == "install") installing = true;
      prev = word;
    }
  }
  return out;
}

// The PACKAGES array of scripts/install-deps.sh.
std::set<std::string> install_deps_packages() {
  std::string text = slurp(std::string(DBLOCK_EXAMPLES_SRC) + "/../scripts/install-deps.sh");
  std::set<std::string> out;
  auto begin = text.find("PACKAGES=(");
  auto end = text.find(')', begin);
  if (begin == std::string::npos || end == std::string::npos) return out;
  std::istringstream words(text.substr(begin + 10, end - begin - 10));
  std::string w;
  while (words >> w)
    out.insert(w);
  return out;
}

}  // namespace

TEST_CASE("docker/compose.yaml: PostgreSQL, MySQL and MariaDB preconfigured for the tests",
          "[unit][docker]") {
  const YAML::Node compose = YAML::LoadFile(docker_dir + "/compose.yaml");
  const YAML::Node services = compose["services"];
  REQUIRE(services.IsMap());
  CHECK(services.size() == 3);

  struct expected {
    const char* name;
    const char* image;
    int published, target;
    const char *db_key, *user_key, *password_key;
    const char* health_tool;
  };
  const expected all[] = {
      {"postgres", "postgres:16", 55432, 5432, "POSTGRES_DB", "POSTGRES_USER", "POSTGRES_PASSWORD",
       "pg_isready"},
      {"mysql", "mysql:8.4", 53306, 3306, "MYSQL_DATABASE", "MYSQL_USER", "MYSQL_PASSWORD",
       "mysqladmin ping"},
      {"mariadb", "mariadb:10.11", 53307, 3306, "MARIADB_DATABASE", "MARIADB_USER",
       "MARIADB_PASSWORD", "healthcheck.sh"},
  };
  const std::string readme = slurp(docker_dir + "/README.md");
  for (const auto& x : all) {
    INFO("service " << x.name);
    const YAML::Node s = services[x.name];
    REQUIRE(s.IsMap());
    CHECK(s["image"].as<std::string>() == x.image);

    auto p = ports(s);
    REQUIRE(p.size() == 1);
    CHECK(p[0].published == x.published);
    CHECK(p[0].target == x.target);
    CHECK(p[0].host_ip == "127.0.0.1");  // test credentials: never on every interface

    auto env = environment(s);
    CHECK(env[x.db_key] == "dblock_test");
    CHECK(env[x.user_key] == "dblock");
    CHECK(env[x.password_key] == "dblock-secret");

    const YAML::Node h = s["healthcheck"];
    REQUIRE(h.IsMap());
    auto test = health_test(s);
    CHECK(test.rfind("CMD", 0) == 0);
    CHECK(test.find(x.health_tool) != std::string::npos);
    CHECK(h["interval"]);
    CHECK(h["retries"].as<int>() > 0);

    // The README documents the URL that the suite takes from these values.
    const std::string scheme = std::string(x.name) == "postgres" ? "postgresql" : "mysql";
    const std::string url = scheme + "://" + env[x.user_key] + ":" + env[x.password_key] +
                            "@127.0.0.1:" + std::to_string(p[0].published) + "/" + env[x.db_key];
    INFO("url " << url);
    CHECK(readme.find(url) != std::string::npos);
  }
  // MySQL 8.4's test user signs in with the native plugin (the server's default plugin needs TLS
  // from Debian's client library): the server turns it on, the init script mounted for the image
  // gives it to the user.
  {
    const YAML::Node my = services["mysql"];
    std::string command;
    for (const auto& c : my["command"])
      command += c.as<std::string>() + " ";
    CHECK(command.find("--mysql-native-password=ON") != std::string::npos);
    bool mounted = false;
    for (const auto& v : my["volumes"])
      if (v.as<std::string>() == "./mysql-init:/docker-entrypoint-initdb.d:ro") mounted = true;
    CHECK(mounted);
    const std::string init = slurp(docker_dir + "/mysql-init/native-password.sql");
    CHECK(init.find("ALTER USER 'dblock'@'%' IDENTIFIED WITH mysql_native_password BY "
                    "'dblock-secret'") != std::string::npos);
  }
  // MySQL and MariaDB also need a root password (or an explicit random/empty one).
  for (const char* name : {"mysql", "mariadb"}) {
    auto env = environment(services[name]);
    bool root = false;
    for (const auto& [k, v] : env)
      if (k.find("ROOT_PASSWORD") != std::string::npos) root = true;
    CHECK(root);
  }
}

TEST_CASE("docker/Dockerfile: builds the CLI from Debian packages, ships it in a runtime stage",
          "[unit][docker]") {
  const std::string text = slurp(docker_dir + "/Dockerfile");
  REQUIRE(!text.empty());
  auto st = stages(text);
  REQUIRE(st.size() == 2);
  CHECK(st[0].from.rfind("debian:12", 0) == 0);
  CHECK(st[1].from.rfind("debian:12", 0) == 0);

  // Every package the build needs, and each of them also in scripts/install-deps.sh.
  const auto deps = install_deps_packages();
  REQUIRE(!deps.empty());
  for (const char* pkg :
       {"libsoci-dev", "libboost-dev", "libpq-dev", "libmariadb-dev", "libsqlite3-dev",
        "liburiparser-dev", "libcli11-dev", "nlohmann-json3-dev", "cmake", "g++"}) {
    INFO("package " << pkg);
    CHECK(st[0].packages.count(pkg) == 1);
    CHECK(deps.count(pkg) == 1);
  }
  // The build stage installs nothing that install-deps.sh does not know about.
  for (const auto& pkg : st[0].packages) {
    INFO("build-stage package " << pkg);
    CHECK(deps.count(pkg) == 1);
  }
  std::string build;
  for (const auto& l : st[0].lines)
    build += l + "\n";
  CHECK(build.find("-DDBLOCK_TESTS=OFF") != std::string::npos);
  CHECK(build.find("-DDBLOCK_EXAMPLES=OFF") != std::string::npos);

  // The runtime stage: the client libraries behind SOCI's backends, and the binary.
  for (const char* pkg :
       {"libsoci-core4.0", "libsoci-postgresql4.0", "libsoci-mysql4.0", "libsoci-sqlite3-4.0",
        "libpq5", "libmariadb3", "libsqlite3-0", "liburiparser1"}) {
    INFO("runtime package " << pkg);
    CHECK(st[1].packages.count(pkg) == 1);
  }
  std::string runtime;
  for (const auto& l : st[1].lines)
    runtime += l + "\n";
  CHECK(runtime.find("COPY --from=build /usr/local/bin/dblock /usr/local/bin/dblock") !=
        std::string::npos);
  CHECK(runtime.find("ENTRYPOINT") != std::string::npos);
}
