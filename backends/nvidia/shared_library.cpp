// dlopen over candidate names (see shared_library.h).
#include "backends/nvidia/shared_library.h"

#include <dlfcn.h>
#include <link.h>

#include "core/error.h"

namespace llama4d::nvidia {

std::string version_text(size_t version) {
  return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100);
}

OpenedLibrary try_open_first_library(const std::vector<std::string>& candidates,
                                     const std::function<std::string(void*)>& missing_symbols) {
  std::string tried;
  for (const std::string& name : candidates) {
    if (name.empty()) continue;
    void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* why = dlerror();
      tried += "; " + name + ": " + (why ? why : "not found");
      continue;
    }
    OpenedLibrary opened{library, name, ""};
    const link_map* map = nullptr;
    if (dlinfo(library, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr && map->l_name[0])
      opened.path = map->l_name;
    const std::string missing = missing_symbols(library);
    if (!missing.empty()) {
      tried += "; " + opened.path + " lacks " + missing;
      dlclose(library);
      continue;
    }
    return opened;
  }
  return OpenedLibrary{nullptr, "", tried};
}

OpenedLibrary open_first_library(const std::vector<std::string>& candidates,
                                 const std::function<std::string(void*)>& missing_symbols, const std::string& what,
                                 const std::string& remedy) {
  OpenedLibrary opened = try_open_first_library(candidates, missing_symbols);
  if (opened.handle != nullptr) return opened;
  std::string names;
  for (const std::string& n : candidates) names += (names.empty() ? "" : ", ") + n;
  if (names.empty()) names = "(no candidates)";
  throw InputError("--kernels fast needs NVIDIA's " + what + ", and none of " + names + " could be used" +
                   opened.failures + " (" + remedy + ")");
}

}  // namespace llama4d::nvidia
