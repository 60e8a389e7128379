#pragma once
/// \file
/// Native loops for fused clusters, the code generation behind
/// `function_options::jit_compile`. A tiled cluster runs one op at a time over a
/// tile, storing every intermediate in a tile buffer; a native loop runs all of the
/// cluster's ops on one xsimd batch after another, with the intermediates in
/// registers, as a hand-written loop would. The loop calls the ops' own functors
/// (kiln/ops/elementwise.hpp) and folded arithmetic's scale_and_shift
/// (kiln/exec/fold.hpp), so it computes the tiled kernels' bits.
///
/// The source of a loop is compiled by the system C++ compiler into a shared
/// library, loaded with dlopen and kept on disk under a name derived from its text
/// and kiln's headers, so a later process loads it without compiling. Settings come
/// from the environment:
/// - `KILN_JIT_CXX`: the compiler (default `c++`);
/// - `KILN_JIT_FLAGS`: more flags, separated by spaces (say `-I` for xsimd);
/// - `KILN_JIT_CACHE`: the directory (default `$XDG_CACHE_HOME/kiln/jit` or
///   `~/.cache/kiln/jit`).
/// When a loop cannot be compiled or loaded, its cluster runs tiled, and kiln says
/// why once on stderr.

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

// POSIX calls rather than <filesystem> and <fstream>, which every file that includes
// kiln would parse (about 0.1 s of the include) for a feature few programs turn on.
#if __has_include(<dlfcn.h>) && __has_include(<spawn.h>) && __has_include(<sys/wait.h>) && __has_include(<dirent.h>)
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#define KILN_HAS_NATIVE_LOOPS 1
extern char** environ;
#else
#define KILN_HAS_NATIVE_LOOPS 0
#endif

#include "kiln/backend/cpu/streaming.hpp"
#include "kiln/config.hpp"
#include "kiln/core/hooks.hpp"
#include "kiln/exec/jit_switch.hpp"
#include "kiln/exec/plan.hpp"

namespace kiln::detail::exec {

/// The C++ element type of a dtype that native loops handle, or "" for others.
template <class = void>
std::string_view native_type_name(dtype t) {
  switch (t) {
    case float32: return "float";
    case float64: return "double";
    case int32: return "std::int32_t";
    case int64: return "std::int64_t";
    default: return {};
  }
}

/// This header's absolute path: under kiln's own headers, or the single header itself.
template <class = void>
std::string jit_header() {
  std::string path = __FILE__;
#if KILN_HAS_NATIVE_LOOPS
  if (!path.starts_with('/'))
    if (char* cwd = ::getcwd(nullptr, 0)) {
      path = std::string(cwd) + '/' + path;
      std::free(cwd);
    }
#endif
  return path;
}

/// The directory holding kiln's own headers (`.../include/`), or "" when kiln is
/// used through its single header.
template <class = void>
std::string kiln_include_root() {
  const std::string here = jit_header();
  const std::string own = "kiln/exec/jit.hpp";
  return here.ends_with(own) ? here.substr(0, here.size() - own.size()) : std::string();
}

/// The lines a native loop's source starts with: kiln's op functors, folded
/// arithmetic and xsimd. From kiln's own headers (found with `-I`
/// kiln_include_root()), only those; from the single header, all of it, with the
/// library parts declared only.
template <class = void>
std::string native_prelude() {
  std::string s = "#include <cstdint>\n#include <type_traits>\n#include <xsimd/xsimd.hpp>\n";
  if (!kiln_include_root().empty())
    return s + "#include \"kiln/backend/cpu/streaming.hpp\"\n#include \"kiln/exec/fold.hpp\"\n";
  return s + "#define KILN_SEPARATE_COMPILATION 1\n#define KILN_DETAIL_NATIVE_LOOP_SOURCE 1\n#include \"" + jit_header() +
         "\"\n";
}

/// The source of cluster `c` as one native loop, `extern "C" kiln_native_loop` of
/// type native_fn; "" when the cluster has fewer than two ops, folded ones included
/// (nothing to keep in registers), or an op has no SIMD functor for the cluster's
/// one dtype. Like the elementwise kernels, a loop whose results are too large for
/// the cache writes them with non-temporal stores.
/// It holds lines such as `const B v0 = kiln::ops::abs{}(m3);`.
template <class = void>
KILN_COLD std::string native_source(const fused_cluster& c) {
  std::size_t ops = 0;
  for (const instruction& i : c.code) ops += 1 + std::size_t(i.folded_ops);
  if (ops < 2) return {};
  const dtype type = c.code[0].type;
  const std::string_view element = native_type_name(type);
  if (element.empty()) return {};
  for (const instruction& i : c.code)
    if (i.native_name.empty() || i.type != type) return {};

  // Table entries below `c.buffers` are tile buffers: the cluster's intermediates
  // (kept in registers here) and gathered operands (loaded). Entries from
  // `c.buffers` on are operands in memory: loaded, one broadcast value, or stored.
  std::string setup, body, written;
  std::vector<std::string> held(std::size_t(c.table_size));  // the register holding an entry's value
  std::vector<bool> splat(std::size_t(c.table_size), false);
  auto operand = [&](int entry, bool contiguous) {
    const std::size_t e = std::size_t(entry);
    const std::string n = std::to_string(e);
    if (!contiguous) {
      if (!splat[e]) setup += "  const B s" + n + "(*static_cast<const T*>(table[" + n + "]));\n";
      splat[e] = true;
      return "s" + n;
    }
    if (held[e].empty()) {
      setup += "  const T* const p" + n + " = static_cast<const T*>(table[" + n + "]);\n";
      body += "      const B m" + n + " = B::load_unaligned(p" + n + " + i);\n";
      held[e] = "m" + n;
    }
    return held[e];
  };
  for (std::size_t k = 0; k < c.code.size(); ++k) {
    const instruction& ins = c.code[k];
    const bool folded = ins.compound != nullptr;
    std::string call = std::string(ins.native_name) + "{}(";
    for (int a = 0; a < ins.arity; ++a) {
      std::string x = operand(ins.in[std::size_t(a)], (ins.contig >> a) & 1u);
      if (folded && ins.fold.pre) x = scale_and_shift_source(x, ins.fold.pre_scale, ins.fold.pre_shift, operand);
      call += (a ? ", " : "") + x;
    }
    call += ")";
    if (folded) call = scale_and_shift_source(call, ins.fold.scale, ins.fold.shift, operand);
    const std::string v = "v" + std::to_string(k), n = std::to_string(ins.out);
    body += "      const B " + v + " = " + call + ";\n";
    held[std::size_t(ins.out)] = v;
    if (ins.out >= c.buffers) {
      setup += "  T* const w" + n + " = static_cast<T*>(table[" + n + "]);\n";
      body += "      kiln::backend::cpu::store_batch<decltype(stream)::value>(" + v + ", w" + n + " + i);\n";
      written += " && reinterpret_cast<std::uintptr_t>(w" + n + ") % sizeof(B) == 0";
    }
  }
  const bool large = std::size_t(c.size) * size_of(type) >= backend::cpu::streaming_bytes;
  std::string s = "// kiln native loop:";
  for (const instruction& i : c.code) s += " " + std::string(i.native_name.substr(i.native_name.rfind(':') + 1));
  s += "\n" + native_prelude();
  s += "extern \"C\" void kiln_native_loop(void* const* table, std::int64_t len) {\n";
  s += "  using T = " + std::string(element) + ";\n  using B = xsimd::batch<T>;\n";
  s += "  static_assert(" + std::to_string(padded_elements) + " % B::size == 0, \"lengths are multiples of the padding\");\n";
  s += setup;
  s += "  const auto loop = [&](auto stream) {\n    for (std::int64_t i = 0; i < len; i += B::size) {\n" + body + "    }\n  };\n";
  if (large) {
    s += "  if (true" + written + ") {\n    loop(std::true_type{});\n    kiln::backend::cpu::streaming_fence();\n    return;\n  }\n";
  }
  s += "  loop(std::false_type{});\n}\n";
  return s;
}

/// Compiles and loads native loops, once per source text per process (and once per
/// machine, through the disk cache). Thread-safe; loaded libraries stay loaded. (A
/// template, as this header's functions are, so that only a program that turns
/// jit_compile on compiles it.)
template <class = void>
class native_compiler {
 public:
  static native_compiler& instance();

  /// The loop of `source` (from native_source), or nullptr when it cannot be had.
  native_fn load(const std::string& source);

  /// How many loops were compiled (not found on disk) by this process.
  int compiled_count() const;

 private:
  static std::string setting(const char* name, std::string fallback);

#if KILN_HAS_NATIVE_LOOPS
  static std::string cache_directory() {
    if (const char* d = std::getenv("KILN_JIT_CACHE"); d && *d) return d;
    if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/kiln/jit";
    if (const char* d = std::getenv("HOME"); d && *d) return std::string(d) + "/.cache/kiln/jit";
    const char* tmp = std::getenv("TMPDIR");
    return std::string(tmp && *tmp ? tmp : "/tmp") + "/kiln-jit";
  }

  // Every file below `dir`, at any depth; a link to a directory is listed, not
  // followed (a link back up would never end).
  static void files_below(const std::string& dir, std::vector<std::string>& out) {
    DIR* d = ::opendir(dir.c_str());
    if (!d) return;
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      const std::string path = dir + '/' + name;
      struct ::stat st {};
      if (::lstat(path.c_str(), &st) != 0) continue;
      if (S_ISDIR(st.st_mode))
        files_below(path, out);
      else
        out.push_back(path);
    }
    ::closedir(d);
  }

  // Sizes and times of kiln's headers, so that a loop compiled against other
  // headers is not loaded.
  KILN_COLD static std::string headers_fingerprint() {
    std::string s;
    auto add = [&](const std::string& p) {
      struct ::stat st {};
      if (::stat(p.c_str(), &st) != 0) return;
      std::int64_t modified = std::int64_t(st.st_mtime) * 1000000000;
#if defined(__linux__)
      modified += st.st_mtim.tv_nsec;
#endif
      s += p + ':' + std::to_string(std::int64_t(st.st_size)) + ':' + std::to_string(modified) + ';';
    };
    if (const std::string root = kiln_include_root(); !root.empty()) {
      std::vector<std::string> files;
      files_below(root + "kiln", files);
      std::sort(files.begin(), files.end());
      for (const std::string& p : files) add(p);
    } else {
      add(jit_header());
    }
    return s;
  }

  static std::uint64_t fnv1a(std::string_view text) {
    std::uint64_t h = 14695981039346656037ull;
    for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ull;
    return h;
  }

  static std::string read_text(const std::string& path) {
    std::string text;
    if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
      char buffer[4096];
      for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, f)) > 0;) text.append(buffer, n);
      std::fclose(f);
    }
    return text;
  }

  static bool write_text(const std::string& path, const std::string& text) {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return false;
    const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    return std::fclose(f) == 0 && written;
  }

  // mkdir -p: each missing directory of `dir`, in turn.
  static void make_directories(const std::string& dir) {
    for (std::size_t slash = dir.find('/', 1); slash != std::string::npos; slash = dir.find('/', slash + 1))
      ::mkdir(dir.substr(0, slash).c_str(), 0755);
    ::mkdir(dir.c_str(), 0755);
  }
#endif

  KILN_COLD native_fn compile_and_load(const std::string& source, std::string& why);

#if KILN_HAS_NATIVE_LOOPS
  // Runs a command without a shell, its output into `log`; the exit status, or -1.
  static int run(const std::vector<std::string>& args, const std::string& log) {
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    pid_t pid = 0;
    const int started = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (started != 0) return -1;
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0)
      if (errno != EINTR) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
#endif

  mutable std::mutex mutex_;
  std::unordered_map<std::string, native_fn> loaded_;  // by source; nullptr for a failure
  bool warned_ = false;
  int compiled_ = 0;
};

/// Compiles the clusters of plan `p` that native loops handle.
template <class = void>
KILN_COLD void compile_native_loops(execution_plan& p) {
  for (fused_cluster& c : p.clusters)
    if (std::string source = native_source(c); !source.empty()) {
      c.native = native_compiler<>::instance().load(source);
      if (c.native) set_tile(c, single_pass_max_tile);
    }
}


}  // namespace kiln::detail::exec

namespace kiln::detail {
template <class>
struct native_loops {
  static void enable() { hooks().native_loops.store(&exec::compile_native_loops<>, std::memory_order_release); }
};
}  // namespace kiln::detail

#if KILN_DEFINE_LIBRARY
namespace kiln::detail::exec {

template <class Unused>
auto native_compiler<Unused>::instance() -> native_compiler& {
  static native_compiler compiler;
  return compiler;
}

template <class Unused>
auto native_compiler<Unused>::load(const std::string& source) -> native_fn {
  std::lock_guard lock(mutex_);
  if (auto it = loaded_.find(source); it != loaded_.end()) return it->second;
  std::string why;
  native_fn fn = compile_and_load(source, why);
  if (!fn && !warned_) {
    warned_ = true;
    std::fprintf(stderr, "kiln: jit_compile: %s; fused clusters run tiled instead\n", why.c_str());
  }
  loaded_.emplace(source, fn);
  return fn;
}

template <class Unused>
int native_compiler<Unused>::compiled_count() const {
  std::lock_guard lock(mutex_);
  return compiled_;
}

template <class Unused>
std::string native_compiler<Unused>::setting(const char* name, std::string fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

template <class Unused>
auto native_compiler<Unused>::compile_and_load(const std::string& source, std::string& why) -> native_fn {
#if KILN_HAS_NATIVE_LOOPS
  const std::string cxx = setting("KILN_JIT_CXX", "c++");
  std::vector<std::string> args = {cxx, "-std=c++20", "-O3", "-march=native", "-fPIC", "-shared", "-w"};
  if (const std::string root = kiln_include_root(); !root.empty()) args.push_back("-I" + root);
  std::istringstream extra(setting("KILN_JIT_FLAGS", ""));
  for (std::string flag; extra >> flag;) args.push_back(flag);

  static const std::string fingerprint = headers_fingerprint();
  std::string key_text = source + '\n' + fingerprint;
  for (const std::string& a : args) key_text += '\n' + a;
  char name[32];
  std::snprintf(name, sizeof name, "kiln-%016llx", static_cast<unsigned long long>(fnv1a(key_text)));
  const std::string dir = cache_directory(), stem = dir + '/' + name;
  const std::string library = stem + ".so", text = stem + ".cpp", log = stem + ".log";
  make_directories(dir);

  // The disk copy is used when its source is this one; otherwise compile under
  // names of this process, then rename, so that concurrent processes never load
  // a half-written library.
  if (!(::access(library.c_str(), F_OK) == 0 && read_text(text) == source)) {
    const std::string own = stem + '.' + std::to_string(::getpid());
    const std::string tmp_library = own + ".so", tmp_text = own + ".cpp";
    if (!write_text(tmp_text, source)) {
      why = "cannot write " + tmp_text;
      return nullptr;
    }
    args.insert(args.end(), {"-o", tmp_library, tmp_text});
    const int status = run(args, log);
    if (status != 0) {
      ::unlink(tmp_text.c_str());
      why = "`" + cxx + "` failed (" + (status < 0 ? "could not start" : "exit " + std::to_string(status)) + "), see " +
            log;
      return nullptr;
    }
    if (std::rename(tmp_library.c_str(), library.c_str()) != 0 || std::rename(tmp_text.c_str(), text.c_str()) != 0) {
      why = "cannot place " + library + ": " + std::strerror(errno);
      return nullptr;
    }
    ++compiled_;
  }
  void* handle = ::dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    why = std::string("dlopen: ") + ::dlerror();
    return nullptr;
  }
  if (void* symbol = ::dlsym(handle, "kiln_native_loop")) return reinterpret_cast<native_fn>(symbol);
  why = library + " has no kiln_native_loop";
  return nullptr;
#else
  (void)source;
  why = "no dlopen or posix_spawn on this platform";
  return nullptr;
#endif
}

}  // namespace kiln::detail::exec
#endif  // KILN_DEFINE_LIBRARY
