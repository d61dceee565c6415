# ballast: one Makefile for the whole tree.
#
#   make            build everything into build/ (CUDA parts when nvcc is found)
#   make test       build and run every test; ends with "N passed, N failed, N skipped"
#   make run        the demo: synthetic corpus + a short training run
#   make bench      benchmarks (ratios measured side by side)
#   make asan       unit + integration tests under ASan + UBSan (build-asan/)
#   make tsan       the concurrency tests under ThreadSanitizer (build-tsan/)
#   make valgrind   unit tests under valgrind memcheck
#   make fuzz       run each libFuzzer target for FUZZ_SECONDS (default 60)
#   make deps       install missing Debian packages (as root), npm packages of tests/k8s-schema and tests/tokenizer-ref
#
# Each part of the tree adds itself through a module.mk fragment; see
# "Layout" in README.md and docs/layers.md.

BUILD   ?= build
# Build with every core unless the caller chose a -j of its own: CI and a
# newcomer's `make test` both start from nothing.
ifeq ($(filter -j%,$(MAKEFLAGS)),)
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 2)
endif
CUDA    ?= auto
SAN     ?=
V       ?= 0
Q       := $(if $(filter 1,$(V)),,@)

CC      ?= cc
ifeq ($(CC),cc)
CC      := gcc
endif
NVCC    ?= $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))

# Debian packages the build, the tests and the benchmarks need.
DEPS_PKGS := build-essential pkg-config libgrpc-dev libprotobuf-c-dev protobuf-c-compiler \
             liburing-dev libjemalloc-dev libjansson-dev libmicrohttpd-dev libcriterion-dev \
             python3-torch python3-numpy libopenblas-dev libopenblas0-pthread fio valgrind docker-compose python3-yaml \
             libboost-context-dev clang-14 libclang-rt-14-dev libpcre2-dev libicu-dev libgloo-dev iperf3 \
             chromium protobuf-compiler python3-protobuf
PKGS      := grpc libprotobuf-c liburing jansson libmicrohttpd libpcre2-8

# jemalloc is the process allocator of ballastd and ballast-worker (and of
# the test programs, which run their code). Debian's libjemalloc2 exports an
# unprefixed malloc/free, so linking it first, ahead of libc, replaces
# glibc's malloc; --no-as-needed keeps it in a program whatever the objects
# refer to. A program says MALLOC_LIBS = $(JEMALLOC_LIBS) to get it (its
# module.mk); common/jemalloc_stats.c checks at run time that the binding
# happened and exports jemalloc's figures. The others keep glibc's malloc:
# `ballast` is a launcher and one-shot tools (it execs the workers and
# ballastd, and serves no /metrics where jemalloc's figures would go),
# ballast-probe lives for milliseconds, ballast-rdzv holds a few keys.
# Sanitizer builds leave jemalloc out: the sanitizer's malloc comes first
# (and common/jemalloc_stats.c, built with BALLAST_NO_JEMALLOC, says so).
JEMALLOC_LIBS := $(if $(SAN),,-Wl,--push-state,--no-as-needed $(shell pkg-config --libs jemalloc) -Wl,--pop-state)
JEMALLOC_CFLAGS := $(if $(SAN),-DBALLAST_NO_JEMALLOC)

SAN_FLAGS_asan := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
SAN_FLAGS_tsan := -fsanitize=thread -fno-omit-frame-pointer
SAN_FLAGS      := $(SAN_FLAGS_$(SAN))
OPT            := $(if $(SAN),-O1,-O2)

CFLAGS_BASE := -std=c11 -D_GNU_SOURCE -g $(OPT) -Wall -Wextra -Wno-unused-parameter \
               -Wno-missing-field-initializers -fopenmp -pthread $(SAN_FLAGS)
INCLUDES    := -I. -Icommon -I$(BUILD)/gen
PKG_CFLAGS   := $(shell pkg-config --cflags $(PKGS) icu-uc jemalloc)
PKG_LIBS     := $(shell pkg-config --libs $(PKGS))
CFLAGS      += $(CFLAGS_BASE) $(INCLUDES) $(PKG_CFLAGS) $(JEMALLOC_CFLAGS)
# Gloo (CPU collectives between hosts, workers/comm/gloo_engine.cc) is C++:
# its library and libstdc++ come last; --as-needed keeps them out of the
# programs that hold no comm code (ballastd, ballast-rdzv).
GLOO_LIBS   := -lgloo -lstdc++
LDLIBS      += $(PKG_LIBS) -lm -ldl $(GLOO_LIBS)
LDFLAGS     += -fopenmp -pthread -Wl,--as-needed $(SAN_FLAGS)
DEPFLAGS     = -MMD -MP

# ---- CUDA detection ----
ifeq ($(CUDA),0)
HAVE_CUDA := 0
else ifneq ($(NVCC),)
HAVE_CUDA := 1
else
HAVE_CUDA := 0
endif
CUDA_ARCHS  ?= -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=sm_80
NVCCFLAGS   ?= -O2 -g -std=c++17 $(CUDA_ARCHS) -Xcompiler -fPIC,-Wall -I. -Icommon -I$(BUILD)/gen
CUDA_LIBS    = -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lcublas -lnccl -lstdc++

# ---- collected by the module.mk fragments ----
BINS         :=        # programs under $(BUILD)/bin
UNIT_TESTS   :=        # Criterion programs under $(BUILD)/tests
CUDA_OBJS    :=        # objects from .cu files
GEN_SRCS     :=        # generated C sources

COMMON_LIB   := $(BUILD)/lib/libballast_common.a

# OpenBLAS (Debian's libopenblas0-pthread) under the CPU backend's GEMMs is
# opened at run time (workers/backend/cpu_gemm.c), not linked: programs
# that hold the backend also load where it is missing (the GPU machine).
# Only the GEMM benchmark, which calls cblas_sgemm itself, links it
# (libopenblas-dev).
BLAS_LIBS := -lopenblas

# Link a program from its own objects ($^) and the libraries it names in
# LINK_LIBS (a target-specific variable, most dependent first: each program
# links only what it uses). MALLOC_LIBS (target-specific too, empty by
# default) comes first: the allocator that must win over libc's.
LINK = @mkdir -p $(@D); echo "  LD   $@"; \
       $(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(MALLOC_LIBS) $(LINK_LIBS) $(LDLIBS) $(EXTRA_LIBS)

.PHONY: all build deps test run bench asan tsan valgrind clean help check-deps
.DEFAULT_GOAL := all
.SECONDARY:

all: deps
	$(Q)$(MAKE) --no-print-directory build

help:
	@sed -n '2,15p' Makefile | sed 's/^# \{0,1\}//'

# ---- dependencies ----
deps:
	$(Q)missing=$$(for p in $(DEPS_PKGS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "deps: installing:" $$missing; \
	    (apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null || { echo "deps: apt-get install failed" >&2; exit 1; }; \
	  else \
	    echo "deps: missing Debian packages: $$missing" >&2; \
	    echo "deps: run as root: apt-get install -y $$missing" >&2; exit 1; \
	  fi; \
	fi
	$(Q)sh tests/k8s-schema/install.sh
	$(Q)sh tests/tokenizer-ref/install.sh

include common/module.mk
include $(wildcard services/*/module.mk)
include workers/module.mk
include tests/module.mk

build: report $(BINS) $(UNIT_TESTS) $(BUILD)/.cuda-stamp

report:
	@echo "build: C compiler $(CC) ($(shell $(CC) -dumpversion))"
	@echo "build: nvcc $(if $(filter 1,$(HAVE_CUDA)),found at $(NVCC): building CUDA parts,$(if $(filter 0,$(CUDA)),disabled (CUDA=0),missing: CUDA parts skipped))"
	@echo "build: fio $(if $(shell command -v fio),found,missing: spill benchmark compares nothing)"
	@echo "build: python3-torch $(if $(shell /usr/bin/python3 -c 'import torch' 2>/dev/null && echo y),found,missing: reference tests skip)"
	@echo "build: libFuzzer $(if $(filter 1,$(HAVE_FUZZ)),found ($(FUZZ_CC)): fuzz targets in $(BUILD)/fuzz,$(if $(SAN),not in sanitizer builds,missing (clang-14, libclang-rt-14-dev): fuzz targets skipped))"
.PHONY: report

$(BUILD)/.cuda-stamp: $(CUDA_OBJS)
	@mkdir -p $(@D) && touch $@

# ---- pattern rules ----
$(BUILD)/obj/%.o: %.c | $(GEN_HDRS)
	@mkdir -p $(@D)
	@echo "  CC   $<"
	$(Q)$(CC) $(CFLAGS) $(DEPFLAGS) -c $< -o $@

# the one C++ file of the tree, the Gloo adapter
CXXFLAGS_BASE := -std=c++17 -D_GNU_SOURCE -g $(OPT) -Wall -Wextra -Wno-unused-parameter \
                 -Wno-missing-field-initializers -pthread $(SAN_FLAGS)
$(BUILD)/obj/%.o: %.cc | $(GEN_HDRS)
	@mkdir -p $(@D)
	@echo "  CXX  $<"
	$(Q)$(CXX) $(CXXFLAGS_BASE) $(INCLUDES) $(DEPFLAGS) -c $< -o $@

$(BUILD)/cuobj/%.o: %.cu
	@mkdir -p $(@D)
	@echo "  NVCC $<"
	$(Q)$(NVCC) $(NVCCFLAGS) -c $< -o $@

# ---- tests ----
test: deps
	$(Q)$(MAKE) --no-print-directory build
	$(Q)BUILD=$(BUILD) tests/run.sh $(T)

asan: deps
	$(Q)$(MAKE) --no-print-directory BUILD=build-asan SAN=asan CUDA=0 build
	$(Q)BUILD=build-asan BALLAST_SAN=asan tests/run.sh --no-reference $(T)

tsan: deps
	$(Q)$(MAKE) --no-print-directory BUILD=build-tsan SAN=tsan CUDA=0 build
	$(Q)BUILD=build-tsan BALLAST_SAN=tsan tests/run.sh --only-concurrency $(T)

valgrind: deps
	$(Q)$(MAKE) --no-print-directory build
	$(Q)BUILD=$(BUILD) BALLAST_VALGRIND=1 tests/run.sh --no-reference $(T)

bench: deps
	$(Q)$(MAKE) --no-print-directory build
	$(Q)BUILD=$(BUILD) tests/bench/run.sh

run: deps
	$(Q)$(MAKE) --no-print-directory build
	$(Q)BUILD=$(BUILD) tests/demo.sh

clean:
	rm -rf build build-asan build-tsan

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
