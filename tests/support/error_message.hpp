// The message of the hisparse::Error a call throws, for tests of error messages.
#pragma once

#include <string>
#include <utility>

#include "core/error.hpp"

namespace hisparse::test {

/// What `call` throws as hisparse::Error, or a note that it threw nothing (so that comparing it
/// with the expected message fails and says why). Other exceptions propagate and fail the test.
template <class F>
std::string error_message(F&& call) {
  try {
    std::forward<F>(call)();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no hisparse::Error was thrown)";
}

}  // namespace hisparse::test
