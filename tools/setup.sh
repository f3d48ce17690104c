#!/usr/bin/env bash
# Installs what vcuda needs to build and test, from Debian packages. Idempotent: installs only what is missing.
set -euo pipefail
pkgs=(cmake ninja-build g++ python3 clang-format clang-tidy
      libboost-dev libflatbuffers-dev flatbuffers-compiler libspdlog-dev libfmt-dev catch2
      libcli11-dev nlohmann-json3-dev libsqlite3-dev libssl-dev python3-pytest)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi
cuda_root="${CUDAToolkit_ROOT:-/usr/local/cuda}"
if [ ! -f "$cuda_root/include/cuda.h" ]; then
  echo "setup: the CUDA toolkit is missing at $cuda_root; install CUDA 13.0 there or set CUDAToolkit_ROOT" >&2
  exit 1
fi
