#pragma once
/// \file
/// `this_thread_object<T>()`: a per-thread object that code running while the thread's
/// objects are destroyed can still ask for, safely.

namespace kiln::detail {

/// This thread's `T`, made on first use; null once the thread has begun destroying it
/// (a static tensor freed at exit, a call from another thread_local's destructor). It
/// is reached through trivially destructible thread_locals, which stay readable then.
/// \code
/// struct counter { int calls = 0; };
/// if (counter* c = kiln::detail::this_thread_object<counter>()) ++c->calls;
/// \endcode
template <class T>
T* this_thread_object() {
  thread_local T* current = nullptr;
  thread_local bool finished = false;
  if (!current && !finished) {
    struct owner {
      T object;
      ~owner() {
        current = nullptr;
        finished = true;
      }
    };
    thread_local owner cleanup;
    current = &cleanup.object;
  }
  return current;
}

}  // namespace kiln::detail
