# tests/: Criterion unit tests (tests/unit/test_*.c), helper programs for the
# integration tests (tests/integration/*.c), benchmarks (tests/bench/*.c).
# Tests may drive any layer, so they link every library of the tree, top down,
# and run on jemalloc like the programs whose code they drive.

# tests/lib/: test doubles (backends whose memory the host cannot touch)
# and the test build of ballast-worker that uses them.
TEST_LIB := $(BUILD)/lib/libballast_testlib.a
TEST_LIB_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(filter-out %_main.c,$(wildcard tests/lib/*.c)))
$(TEST_LIB): $(TEST_LIB_OBJS)
	@mkdir -p $(@D)
	@echo "  AR   $@"
	$(Q)rm -f $@ && ar rcs $@ $^

TEST_LIBS := $(TEST_LIB) $(WORKER_LIBS) $(CUDA_LIB) $(OFFLOAD_LIB) $(RDZV_LIB) $(COMMON_LIB)

UNIT_TESTS += $(patsubst tests/unit/%.c,$(BUILD)/tests/unit/%,$(wildcard tests/unit/test_*.c))
UNIT_TESTS += $(patsubst tests/integration/%.c,$(BUILD)/tests/integration/%,$(wildcard tests/integration/*.c))
UNIT_TESTS += $(patsubst tests/bench/%.c,$(BUILD)/tests/bench/%,$(wildcard tests/bench/*.c))

# private: a program these targets depend on (tests/bin/ballast copies
# bin/ballast) must not inherit them when make builds it for them first
$(BUILD)/tests/%: private LINK_LIBS = $(TEST_LIBS) $(GPU_LIBS)
$(BUILD)/tests/%: private MALLOC_LIBS = $(JEMALLOC_LIBS)

$(BUILD)/tests/unit/%: $(BUILD)/obj/tests/unit/%.o $(TEST_LIBS)
	$(LINK) -lcriterion

$(BUILD)/tests/integration/%: $(BUILD)/obj/tests/integration/%.o $(TEST_LIBS)
	$(LINK)

$(BUILD)/tests/bench/%: $(BUILD)/obj/tests/bench/%.o $(TEST_LIBS)
	$(LINK)

# the GEMM benchmark's reference: one cblas_sgemm call, threaded by OpenBLAS
$(BUILD)/tests/bench/bench_cpu_gemm: EXTRA_LIBS += $(BLAS_LIBS)

# tests/unit/nccl_fake.c: libnccl and libcudart stand-ins in one shared
# library, which test_comm_nccl_wait points the NCCL backend at
NCCL_FAKE := $(BUILD)/tests/lib/nccl_fake.so
UNIT_TESTS += $(NCCL_FAKE)
$(NCCL_FAKE): tests/unit/nccl_fake.c
	@mkdir -p $(@D)
	@echo "  CCLD $@"
	$(Q)$(CC) -std=c11 -D_GNU_SOURCE -g -O1 -Wall -Wextra -fPIC -shared $(SAN_FLAGS) -o $@ $<
$(BUILD)/tests/unit/test_comm_nccl_wait: $(NCCL_FAKE)

-include tests/gpu/module.mk

# The test build of the programs: $(BUILD)/tests/bin/ballast-worker with the
# test doubles (tests/lib/worker_test_main.c), and ballast and ballastd
# beside it, so that `ballast train` there starts that worker. Integration tests that need a double
# run these.
TEST_BINS := $(BUILD)/tests/bin/ballast-worker $(BUILD)/tests/bin/ballast $(BUILD)/tests/bin/ballastd
UNIT_TESTS += $(TEST_BINS)
$(BUILD)/tests/bin/ballast-worker: LINK_LIBS = $(TEST_LIB) $(WORKER_BIN_LIBS) $(GPU_LIBS)
$(BUILD)/tests/bin/ballast-worker: $(BUILD)/obj/tests/lib/worker_test_main.o $(TEST_LIB) $(WORKER_BIN_LIBS)
	$(LINK)
# copies, not links: ballast starts the ballast-worker and ballastd found
# next to its own executable
$(BUILD)/tests/bin/ballast $(BUILD)/tests/bin/ballastd: $(BUILD)/tests/bin/%: $(BUILD)/bin/%
	@mkdir -p $(@D)
	$(Q)cp $< $@
-include tests/emu/module.mk
-include tests/fuzz/module.mk
