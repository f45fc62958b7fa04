#!/usr/bin/env bash
# Builds the C test program tests/c/coli_c_check.c against the coli store C ABI.
#   tests/c/build.sh LIB_DIR OUT_BINARY
# LIB_DIR holds libcoli_store_ffi.a (cargo build -p coli-store-ffi; e.g. target/debug).
# Also checks that store/ffi/include/coli_store.h compiles as C11 and as C++ (extern "C").
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
lib_dir=${1:?usage: build.sh LIB_DIR OUT_BINARY}
out=${2:?usage: build.sh LIB_DIR OUT_BINARY}
cc=${CC:-gcc}
inc="$root/store/ffi/include"
if [ ! -f "$lib_dir/libcoli_store_ffi.a" ]; then
  echo "build.sh: $lib_dir/libcoli_store_ffi.a not found; run: cargo build -p coli-store-ffi" >&2
  exit 2
fi
# The header alone, as C and as C++.
echo '#include "coli_store.h"' | "$cc" -std=c11 -Wall -Wextra -Werror -pedantic -I "$inc" -x c -fsyntax-only -
if command -v g++ >/dev/null 2>&1; then
  echo '#include "coli_store.h"' | g++ -std=c++11 -Wall -Wextra -Werror -I "$inc" -x c++ -fsyntax-only -
fi
"$cc" -std=c11 -g -O1 -Wall -Wextra -Werror -I "$inc" "$root/tests/c/coli_c_check.c" \
  "$lib_dir/libcoli_store_ffi.a" -lpthread -ldl -lm -o "$out"
