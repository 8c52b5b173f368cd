// One process, no GPU needed: NCCL's host functions loaded at run time (src/cuda/transport/
// nccl_api.hpp) from the libnccl CMake found, the release checked against the headers, and the
// errors when PMOE_NCCL_LIBRARY names a missing file or a library that is not NCCL.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "cuda/transport/nccl_api.hpp"

namespace pmoe::cuda {
namespace {

std::string load_error() {
  try {
    nccl_api();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Order matters: a failed load is not remembered, a successful one is (once per process).
TEST(NcclApi, RefusesWhatIsNotNcclThenLoadsTheReleaseOfItsHeaders) {
  setenv("PMOE_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
  std::string error = load_error();
  EXPECT_NE(error.find("cannot load NCCL (/nonexistent/libnccl.so.2)"), std::string::npos) << error;
  EXPECT_NE(error.find("set PMOE_NCCL_LIBRARY"), std::string::npos) << error;

  setenv("PMOE_NCCL_LIBRARY", "libz.so.1", 1);  // loads, but is not NCCL
  error = load_error();
  EXPECT_NE(error.find("libz.so.1 has no ncclGetVersion"), std::string::npos) << error;

  unsetenv("PMOE_NCCL_LIBRARY");
  const NcclApi& api = nccl_api();
  EXPECT_EQ(api.version / 100, NCCL_MAJOR * 100 + NCCL_MINOR) << api.path;
  EXPECT_STREQ(api.GetErrorString(ncclInvalidArgument),
               "invalid argument (run with NCCL_DEBUG=WARN for details)")
      << "NCCL's own text for a code";
  EXPECT_EQ(&nccl_api(), &api) << "loaded once";
}

TEST(NcclApi, CheckMacroNamesTheCallAndNcclsText) {
  const NcclApi& api = nccl_api();
  try {
    PMOE_NCCL_CHECK(api.GetVersion(nullptr));  // NCCL refuses a null output pointer
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("api.GetVersion(nullptr) failed at"), std::string::npos) << what;
    EXPECT_NE(what.find("test_nccl_api.cu:"), std::string::npos) << what;
    EXPECT_NE(what.find("invalid argument"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace pmoe::cuda
