# Finds every dependency once and turns it into an imported target the parts link to.
# All come from Debian packages (tools/setup.sh installs them); the CUDA toolkit from /usr/local/cuda.

find_package(Python3 3.9 REQUIRED COMPONENTS Interpreter)
find_package(Threads REQUIRED)

# --- CUDA toolkit: headers for the API we reproduce, the stub library for the export list, nvcc for tests.
if(NOT CUDAToolkit_ROOT)
  if(DEFINED ENV{CUDAToolkit_ROOT})
    set(CUDAToolkit_ROOT $ENV{CUDAToolkit_ROOT})
  else()
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
endif()
set(VCUDA_CUDA_INCLUDE ${CUDAToolkit_ROOT}/include)
set(VCUDA_CUDA_STUB ${CUDAToolkit_ROOT}/lib64/stubs/libcuda.so)
if(NOT EXISTS ${VCUDA_CUDA_INCLUDE}/cuda.h OR NOT EXISTS ${VCUDA_CUDA_STUB})
  message(FATAL_ERROR
    "CUDA toolkit not found at '${CUDAToolkit_ROOT}' (need include/cuda.h and lib64/stubs/libcuda.so).\n"
    "Install the CUDA 13.0 toolkit (https://developer.nvidia.com/cuda-downloads) to /usr/local/cuda, "
    "or point -DCUDAToolkit_ROOT=/path/to/cuda at an existing one.")
endif()
add_library(vcuda_cuda_headers INTERFACE)
# SYSTEM: cuda.h is not ours; its warnings are not ours to fix.
target_include_directories(vcuda_cuda_headers SYSTEM INTERFACE ${VCUDA_CUDA_INCLUDE})
find_program(VCUDA_NVCC nvcc HINTS ${CUDAToolkit_ROOT}/bin NO_DEFAULT_PATH)

# --- FlatBuffers: flatc at build time, headers only at run time.
find_program(VCUDA_FLATC flatc)
find_path(VCUDA_FLATBUFFERS_INCLUDE flatbuffers/flatbuffers.h)
if(NOT VCUDA_FLATC OR NOT VCUDA_FLATBUFFERS_INCLUDE)
  message(FATAL_ERROR "FlatBuffers not found: run tools/setup.sh (apt-get install flatbuffers-compiler libflatbuffers-dev)")
endif()

# --- Boost.Asio (header-only use).
find_path(VCUDA_BOOST_INCLUDE boost/asio.hpp)
if(NOT VCUDA_BOOST_INCLUDE)
  message(FATAL_ERROR "Boost.Asio not found: run tools/setup.sh (apt-get install libboost-dev)")
endif()

# --- spdlog + fmt, header-only so binaries need no libspdlog/libfmt at run time.
find_path(VCUDA_SPDLOG_INCLUDE spdlog/spdlog.h)
find_path(VCUDA_FMT_INCLUDE fmt/format.h)
if(NOT VCUDA_SPDLOG_INCLUDE OR NOT VCUDA_FMT_INCLUDE)
  message(FATAL_ERROR "spdlog/fmt not found: run tools/setup.sh (apt-get install libspdlog-dev libfmt-dev)")
endif()

add_library(vcuda_third_party INTERFACE)
target_include_directories(vcuda_third_party SYSTEM INTERFACE
  ${VCUDA_FLATBUFFERS_INCLUDE} ${VCUDA_BOOST_INCLUDE} ${VCUDA_SPDLOG_INCLUDE} ${VCUDA_FMT_INCLUDE})
target_compile_definitions(vcuda_third_party INTERFACE
  SPDLOG_HEADER_ONLY SPDLOG_FMT_EXTERNAL FMT_HEADER_ONLY BOOST_ASIO_NO_DEPRECATED)
target_link_libraries(vcuda_third_party INTERFACE Threads::Threads ${CMAKE_DL_LIBS})

# --- CLI11, nlohmann-json (headers), SQLite and OpenSSL (static, so daemons carry them).
find_path(VCUDA_CLI11_INCLUDE CLI/CLI.hpp)
find_path(VCUDA_JSON_INCLUDE nlohmann/json.hpp)
find_path(VCUDA_SQLITE_INCLUDE sqlite3.h)
find_library(VCUDA_SQLITE_STATIC libsqlite3.a)
find_library(VCUDA_CRYPTO_STATIC libcrypto.a)
find_library(VCUDA_SSL_STATIC libssl.a)
foreach(v VCUDA_CLI11_INCLUDE VCUDA_JSON_INCLUDE VCUDA_SQLITE_INCLUDE VCUDA_SQLITE_STATIC VCUDA_CRYPTO_STATIC
          VCUDA_SSL_STATIC)
  if(NOT ${v})
    message(FATAL_ERROR "${v} not found: run tools/setup.sh (libcli11-dev nlohmann-json3-dev libsqlite3-dev libssl-dev)")
  endif()
endforeach()
add_library(vcuda_daemon_deps INTERFACE)
target_include_directories(vcuda_daemon_deps SYSTEM INTERFACE ${VCUDA_CLI11_INCLUDE} ${VCUDA_JSON_INCLUDE} ${VCUDA_SQLITE_INCLUDE})
target_link_libraries(vcuda_daemon_deps INTERFACE ${VCUDA_SQLITE_STATIC} ${VCUDA_CRYPTO_STATIC} Threads::Threads ${CMAKE_DL_LIBS})

# TLS (common/tls.cpp): OpenSSL linked in, also into the client libcuda.so.1, which must need nothing but the C
# library (Debian's libssl.a and libcrypto.a are position-independent). Its symbols stay hidden there (the
# client's version script exports the driver's only), so an application's own OpenSSL never meets it.
add_library(vcuda_tls_deps INTERFACE)
target_link_libraries(vcuda_tls_deps INTERFACE ${VCUDA_SSL_STATIC} ${VCUDA_CRYPTO_STATIC} Threads::Threads ${CMAKE_DL_LIBS})

# Warnings for our own targets; sanitizers come from presets through VCUDA_SANITIZE.
set(VCUDA_SANITIZE "" CACHE STRING "Sanitizers: address,undefined | thread | empty")
add_library(vcuda_warnings INTERFACE)
target_compile_options(vcuda_warnings INTERFACE -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)
if(VCUDA_SANITIZE)
  target_compile_options(vcuda_warnings INTERFACE -fsanitize=${VCUDA_SANITIZE} -fno-omit-frame-pointer)
  target_link_options(vcuda_warnings INTERFACE -fsanitize=${VCUDA_SANITIZE})
endif()

# Self-contained binaries: libstdc++ and libgcc linked in, so a build made on Debian 12 runs on Ubuntu 24.04.
add_library(vcuda_self_contained INTERFACE)
if(NOT VCUDA_SANITIZE)
  target_link_options(vcuda_self_contained INTERFACE -static-libstdc++ -static-libgcc)
endif()
