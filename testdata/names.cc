// names.cc: C++ names for ptfs's site tests: namespaces, overloads,
// templates, a GCC clone, and two functions whose raw names differ only by
// a Rust legacy hash (they demangle to the same text).
#include <cstdio>
#include <cstdlib>

namespace geo {
namespace detail {
__attribute__((noinline)) long area(long w, long h) { return w * h; }
}  // namespace detail
__attribute__((noinline)) long scale(long v) { return v * 2; }
__attribute__((noinline)) double scale(double v) { return v * 2.5; }
}  // namespace geo

template <class T, int N>
struct Buf {
  T v[N];
  __attribute__((noinline)) T get(int i) { return v[i % N]; }
};

// Only ever called with k == 3: GCC keeps a clone, clonly.constprop.0.
static __attribute__((noinline)) long clonly(long x, long k) {
  long s = 0;
  for (long i = 0; i < x; i++) s += i * k + (s >> 3);
  return s;
}

// Rust legacy mangling: the same path with two hashes.
extern "C" __attribute__((noinline)) long pick_a(long x) __asm__("_ZN4demo4pick17h0123456789abcdefE");
extern "C" __attribute__((noinline)) long pick_b(long x) __asm__("_ZN4demo4pick17hfedcba9876543210E");
long pick_a(long x) { return x + 1; }
long pick_b(long x) { return x + 2; }

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 1;
  Buf<long, 4> b = {{10, 11, 12, 13}};
  long s = 0;
  for (long i = 0; i < n; i++) {
    s += geo::detail::area(i, i + 1);
    s += geo::scale(i) + (long)geo::scale((double)i);
    s += b.get((int)i);
    s += clonly(i, 3) + pick_a(i) + pick_b(i);
  }
  printf("%ld\n", s);
  return 0;
}
