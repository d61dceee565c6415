# tests/fuzz/: libFuzzer targets, one per parser of outside input (see
# tests/fuzz/README.md). Built with clang and libFuzzer when both are found
# (Debian: clang-14, libclang-rt-14-dev), into $(BUILD)/fuzz/, as part of
# `make build` (not in sanitizer builds: the targets carry their own ASan
# and UBSan). The parser sources each target tests are compiled again with
# the fuzzer's coverage and the sanitizers; what they stand on comes from
# the normal libraries. `make fuzz` runs each target for FUZZ_SECONDS;
# `make test` replays tests/fuzz/corpus/ (tests/integration/fuzz_corpus.sh).

FUZZ_CC      ?= $(firstword $(shell command -v clang-14 clang 2>/dev/null))
FUZZ_RTLIB   := $(if $(FUZZ_CC),$(wildcard $(shell $(FUZZ_CC) -print-resource-dir 2>/dev/null)/lib/linux/libclang_rt.fuzzer-x86_64.a))
HAVE_FUZZ    := $(if $(and $(FUZZ_CC),$(FUZZ_RTLIB),$(if $(SAN),,y)),1,0)
FUZZ_SECONDS ?= 60
FUZZ_FLAGS   := -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_CFLAGS   = -std=c11 -D_GNU_SOURCE -g -O1 -Wall -Wno-unused-parameter -pthread $(FUZZ_FLAGS) $(INCLUDES) \
                $(PKG_CFLAGS) -DBALLAST_NO_JEMALLOC
FUZZ_TARGETS := $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BINS    := $(patsubst %,$(BUILD)/fuzz/%,$(FUZZ_TARGETS))
FUZZ_OBJ     := $(BUILD)/fuzz/obj

# the parser sources each target instruments
FUZZ_SRCS_fuzz_config            := workers/model/config.c
FUZZ_SRCS_fuzz_safetensors       := workers/ckpt/safetensors.c
FUZZ_SRCS_fuzz_ckpt_manifest     := workers/ckpt/ckpt.c workers/ckpt/safetensors.c workers/model/config.c
FUZZ_SRCS_fuzz_ballastd_manifest := services/offload/manifest.c
FUZZ_SRCS_fuzz_rpc               := $(BUILD)/gen/offload.pb-c.c $(BUILD)/gen/rendezvous.pb-c.c common/job_name.c
FUZZ_SRCS_fuzz_ring              := common/ring.c
# what they stand on, uninstrumented
FUZZ_LIBS := $(WLIB_ckpt) $(WLIB_parallel) $(WLIB_model) $(WLIB_comm) $(WLIB_data) $(WLIB_backend) $(CUDA_LIB) \
             $(OFFLOAD_LIB) $(RDZV_LIB) $(COMMON_LIB)

$(FUZZ_OBJ)/%.o: %.c | $(GEN_HDRS)
	@mkdir -p $(@D)
	@echo "  FZCC $<"
	$(Q)$(FUZZ_CC) $(FUZZ_CFLAGS) -MMD -MP -c $< -o $@

# one link rule per target: its object, the instrumented parser sources
define FUZZ_LINK_RULE
$(BUILD)/fuzz/$(1): $(FUZZ_OBJ)/tests/fuzz/$(1).o $(patsubst %.c,$(FUZZ_OBJ)/%.o,$(FUZZ_SRCS_$(1))) $(FUZZ_LIBS)
	@echo "  FZLD $$@"
	$(Q)$(FUZZ_CC) -fsanitize=fuzzer,address,undefined -o $$@ $$(filter %.o,$$^) $(FUZZ_LIBS) $(PKG_LIBS) \
	    $(GPU_LIBS) -lgomp -lm -ldl -pthread
endef
$(foreach t,$(FUZZ_TARGETS),$(eval $(call FUZZ_LINK_RULE,$(t))))

.PHONY: fuzz fuzz-build
ifeq ($(HAVE_FUZZ),1)
build: $(FUZZ_BINS)
fuzz-build: $(FUZZ_BINS)
fuzz: deps
	$(Q)$(MAKE) --no-print-directory build
	$(Q)BUILD=$(BUILD) FUZZ_SECONDS=$(FUZZ_SECONDS) tests/fuzz/run.sh $(T)
else
fuzz-build fuzz:
	@echo "fuzz: needs clang and libFuzzer (apt-get install clang-14 libclang-rt-14-dev)$(if $(SAN),; not in sanitizer builds)" >&2; exit 1
endif
