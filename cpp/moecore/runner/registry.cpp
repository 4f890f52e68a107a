// Registry storage: function-local statics (no initialisation-order problem), one mutex.
#include "moecore/runner/registry.h"

#include "moecore/core/error.h"

namespace moecore {
namespace {

struct Registries {
  std::mutex mutex;
  std::map<FusedKey, Registered<FusedFunc>> fused;
  std::map<PreKey, Registered<PrePermuteFn>> pre;
  std::map<PostKey, Registered<PostPermuteFn>> post;
  std::map<MoeRunnerBackend, Registered<CoreFactory>> cores;
  std::map<PreKey, Registered<PrepareFn>> prepared;
  std::vector<std::string> errors;
};

Registries& registries() {
  static Registries r;
  return r;
}

template <typename Map, typename Key>
auto find_in(Map& map, const Key& key) -> std::optional<decltype(map.begin()->second.fn)> {
  std::lock_guard<std::mutex> lock(registries().mutex);
  auto it = map.find(key);
  if (it == map.end()) return std::nullopt;
  return it->second.fn;
}

template <typename Map, typename Key>
bool erase_from(Map& map, const Key& key) {
  std::lock_guard<std::mutex> lock(registries().mutex);
  return map.erase(key) > 0;
}

template <typename Map>
auto list(Map& map) {
  std::lock_guard<std::mutex> lock(registries().mutex);
  std::vector<std::pair<typename Map::key_type, std::string>> out;
  for (const auto& [key, entry] : map) out.emplace_back(key, entry.origin);
  return out;
}

}  // namespace

void register_fused_func(MoeA2ABackend a2a, MoeRunnerBackend runner, FusedFunc fn,
                         std::string origin) {
  MOECORE_CHECK(static_cast<bool>(fn), "register_fused_func: expected a callable");
  Registries& r = registries();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.fused.count({a2a, runner}))
    MOECORE_THROW(InvalidArgument, "Fused function for ", to_string(a2a), " to ",
                  to_string(runner), " is already registered.");
  r.fused[{a2a, runner}] = {std::move(fn), std::move(origin)};
}

void register_pre_permute(DispatchOutputFormat format, MoeRunnerBackend runner, PrePermuteFn fn,
                          std::string origin) {
  MOECORE_CHECK(static_cast<bool>(fn), "register_pre_permute: expected a callable");
  Registries& r = registries();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.pre.count({format, runner}))
    MOECORE_THROW(InvalidArgument, "Pre-permute method for ", to_string(format), " to ",
                  to_string(runner), " is already registered.");
  r.pre[{format, runner}] = {std::move(fn), std::move(origin)};
}

void register_post_permute(MoeRunnerBackend runner, CombineInputFormat format, PostPermuteFn fn,
                           std::string origin) {
  MOECORE_CHECK(static_cast<bool>(fn), "register_post_permute: expected a callable");
  Registries& r = registries();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.post.count({runner, format}))
    MOECORE_THROW(InvalidArgument, "Post-permute method for ", to_string(runner), " to ",
                  to_string(format), " is already registered.");
  r.post[{runner, format}] = {std::move(fn), std::move(origin)};
}

void register_runner_core(MoeRunnerBackend runner, CoreFactory factory, std::string origin) {
  MOECORE_CHECK(static_cast<bool>(factory), "register_runner_core: expected a callable");
  Registries& r = registries();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.cores.count(runner))
    MOECORE_THROW(InvalidArgument, "Runner core for ", to_string(runner),
                  " is already registered.");
  r.cores[runner] = {std::move(factory), std::move(origin)};
}

void register_prepared_run(DispatchOutputFormat format, MoeRunnerBackend runner, PrepareFn fn,
                           std::string origin) {
  MOECORE_CHECK(static_cast<bool>(fn), "register_prepared_run: expected a callable");
  Registries& r = registries();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.prepared.count({format, runner}))
    MOECORE_THROW(InvalidArgument, "Prepared run for ", to_string(format), " to ",
                  to_string(runner), " is already registered.");
  r.prepared[{format, runner}] = {std::move(fn), std::move(origin)};
}

std::optional<FusedFunc> find_fused_func(MoeA2ABackend a2a, MoeRunnerBackend runner) {
  return find_in(registries().fused, FusedKey{a2a, runner});
}
std::optional<PrePermuteFn> find_pre_permute(DispatchOutputFormat format, MoeRunnerBackend runner) {
  return find_in(registries().pre, PreKey{format, runner});
}
std::optional<PostPermuteFn> find_post_permute(MoeRunnerBackend runner, CombineInputFormat format) {
  return find_in(registries().post, PostKey{runner, format});
}
std::optional<CoreFactory> find_runner_core(MoeRunnerBackend runner) {
  return find_in(registries().cores, runner);
}
std::optional<PrepareFn> find_prepared_run(DispatchOutputFormat format, MoeRunnerBackend runner) {
  return find_in(registries().prepared, PreKey{format, runner});
}

bool unregister_fused_func(MoeA2ABackend a2a, MoeRunnerBackend runner) {
  return erase_from(registries().fused, FusedKey{a2a, runner});
}
bool unregister_pre_permute(DispatchOutputFormat format, MoeRunnerBackend runner) {
  return erase_from(registries().pre, PreKey{format, runner});
}
bool unregister_post_permute(MoeRunnerBackend runner, CombineInputFormat format) {
  return erase_from(registries().post, PostKey{runner, format});
}

bool unregister_runner_core(MoeRunnerBackend runner) {
  return erase_from(registries().cores, runner);
}
bool unregister_prepared_run(DispatchOutputFormat format, MoeRunnerBackend runner) {
  return erase_from(registries().prepared, PreKey{format, runner});
}

std::vector<std::pair<FusedKey, std::string>> registered_fused_funcs() {
  return list(registries().fused);
}
std::vector<std::pair<PreKey, std::string>> registered_pre_permutes() {
  return list(registries().pre);
}
std::vector<std::pair<PostKey, std::string>> registered_post_permutes() {
  return list(registries().post);
}
std::vector<std::pair<MoeRunnerBackend, std::string>> registered_runner_cores() {
  return list(registries().cores);
}
std::vector<std::pair<PreKey, std::string>> registered_prepared_runs() {
  return list(registries().prepared);
}

const std::vector<std::string>& registration_errors() { return registries().errors; }

namespace detail {
std::string source_origin(const char* file) {
  const std::string path(file);
  const size_t at = path.rfind("cpp/moecore/");
  return at == std::string::npos ? path : path.substr(at);
}

void record_registration_error(const std::string& what) {
  std::lock_guard<std::mutex> lock(registries().mutex);
  registries().errors.push_back(what);
}
}  // namespace detail

}  // namespace moecore
