# tests/emu/: the emulation tier. Every .cu file of the CUDA backend is
# rewritten by cu2cc.py (launch syntax and __shared__ declarations only)
# and compiled as host C++ with g++ against the headers in
# tests/emu/include, with AddressSanitizer and UBSan; the emulated CUDA
# runtime (runtime.cc, sched.cc), cuBLASLt (cublaslt.cc) and NCCL (nccl.cc)
# are shared libraries with the real sonames, so code that dlopens
# libcudart or libnccl finds them. The GPU checks (tests/gpu/*.c) and the
# test build of ballast-worker are linked against them under
# $(BUILD)/tests/emu/; tests/integration/gpu_emu*.sh run them. Nothing here
# reaches a shipped binary. Needs g++ and python3 only (no nvcc).

EMU_DIR     := $(BUILD)/emu
EMU_LIBDIR  := $(EMU_DIR)/lib
EMU_SAN     := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
EMU_CXX     ?= g++
EMU_CXXFLAGS := -std=c++17 -g -O2 -fPIC -Wall -Wno-unused-function -Wno-unused-variable -Wno-unknown-pragmas -fno-strict-aliasing \
                $(EMU_SAN) -I$(EMU_DIR)/src -Itests/emu/include -I. -Icommon -I$(BUILD)/gen
# cuDNN's headers (types and constants only: attention_cudnn.cu opens the
# library at run time), searched after ours so the emulated runtime wins
EMU_CUDNN_INC := $(firstword $(dir $(wildcard $(CUDA_HOME)/include/cudnn_backend.h /usr/local/cuda/include/cudnn_backend.h)))
EMU_CXXFLAGS += $(if $(EMU_CUDNN_INC),-idirafter $(EMU_CUDNN_INC))
EMU_CU_SRCS := $(wildcard workers/backend/cuda/*.cu)
EMU_CU_OBJS := $(patsubst %.cu,$(EMU_DIR)/obj/%.o,$(EMU_CU_SRCS))
EMU_CUH     := $(patsubst %,$(EMU_DIR)/src/%,$(wildcard workers/backend/cuda/*.cuh))
EMU_HDRS    := $(wildcard tests/emu/*.h tests/emu/include/*.h) $(wildcard workers/backend/cuda/*.h) \
               workers/backend/backend.h
EMU_CUDA_LIB := $(BUILD)/lib/libballast_cuda_emu.a
EMU_SOS     := $(EMU_LIBDIR)/libcudart.so $(EMU_LIBDIR)/libcublasLt.so $(EMU_LIBDIR)/libnccl.so.2
EMU_LIBS     = -L$(EMU_LIBDIR) -Wl,-rpath,$(abspath $(EMU_LIBDIR)) -lcublasLt -lcudart -lstdc++ -ljemalloc

# rewritten sources keep the original's line numbers (#line names it)
$(EMU_DIR)/src/%.cu.cc: %.cu tests/emu/cu2cc.py
	@mkdir -p $(@D)
	$(Q)python3 tests/emu/cu2cc.py $< $@
$(EMU_DIR)/src/%.cuh: %.cuh tests/emu/cu2cc.py
	@mkdir -p $(@D)
	$(Q)python3 tests/emu/cu2cc.py $< $@

$(EMU_DIR)/obj/%.o: $(EMU_DIR)/src/%.cu.cc $(EMU_CUH) $(EMU_HDRS)
	@mkdir -p $(@D)
	@echo "  EMU  $*.cu"
	$(Q)$(EMU_CXX) $(EMU_CXXFLAGS) -c $< -o $@

$(EMU_DIR)/obj/tests/emu/%.o: tests/emu/%.cc $(EMU_HDRS)
	@mkdir -p $(@D)
	@echo "  CXX  $<"
	$(Q)$(EMU_CXX) $(EMU_CXXFLAGS) -c $< -o $@

$(EMU_CUDA_LIB): $(EMU_CU_OBJS)
	@mkdir -p $(@D)
	@echo "  AR   $@"
	$(Q)rm -f $@ && ar rcs $@ $^

$(EMU_LIBDIR)/libcudart.so: $(EMU_DIR)/obj/tests/emu/runtime.o $(EMU_DIR)/obj/tests/emu/sched.o
	@mkdir -p $(@D)
	@echo "  LD   $@"
	$(Q)$(EMU_CXX) -shared $(EMU_SAN) -Wl,-soname,libcudart.so -o $@ $^ -lboost_context
$(EMU_LIBDIR)/libcublasLt.so: $(EMU_DIR)/obj/tests/emu/cublaslt.o $(EMU_LIBDIR)/libcudart.so
	@echo "  LD   $@"
	$(Q)$(EMU_CXX) -shared $(EMU_SAN) -Wl,-soname,libcublasLt.so -o $@ $< -L$(EMU_LIBDIR) -lcudart
# the stand-in cuDNN (cudnn_fake.cc), beside but outside the programs' run
# path: only BALLAST_CUDNN_LIB reaches it. Needs cuDNN's headers.
EMU_CUDNN_FAKE := $(if $(EMU_CUDNN_INC),$(EMU_LIBDIR)/cudnn-fake/libcudnn.so.9)
EMU_SOS += $(EMU_CUDNN_FAKE)
$(EMU_LIBDIR)/cudnn-fake/libcudnn.so.9: $(EMU_DIR)/obj/tests/emu/cudnn_fake.o $(EMU_LIBDIR)/libcudart.so
	@mkdir -p $(@D)
	@echo "  LD   $@"
	$(Q)$(EMU_CXX) -shared $(EMU_SAN) -Wl,-soname,libcudnn.so.9 -o $@ $< -L$(EMU_LIBDIR) -lcudart
$(EMU_LIBDIR)/libnccl.so.2: $(EMU_DIR)/obj/tests/emu/nccl.o $(EMU_LIBDIR)/libcudart.so
	@echo "  LD   $@"
	$(Q)$(EMU_CXX) -shared $(EMU_SAN) -Wl,-soname,libnccl.so.2 -o $@ $< -L$(EMU_LIBDIR) -lcudart

# The GPU checks and gpu_train, built against the emulation headers.
EMU_CHECKS := $(patsubst tests/gpu/%.c,$(BUILD)/tests/emu/%,$(wildcard tests/gpu/*.c))
$(EMU_DIR)/obj/tests/gpu/%.o: tests/gpu/%.c | $(GEN_HDRS)
	@mkdir -p $(@D)
	@echo "  CC   $< (emulation)"
	$(Q)$(CC) $(filter-out -I$(CUDA_HOME)/include,$(CFLAGS)) -Itests/emu/include $(EMU_SAN) $(DEPFLAGS) -c $< -o $@

EMU_TEST_LIBS := $(TEST_LIB) $(WORKER_LIBS) $(EMU_CUDA_LIB) $(OFFLOAD_LIB) $(RDZV_LIB) $(COMMON_LIB)
EMU_LINK = @mkdir -p $(@D); echo "  LD   $@"; \
           $(CC) $(LDFLAGS) $(EMU_SAN) -o $@ $(filter %.o,$^) $(EMU_LINK_LIBS) $(LDLIBS) $(EMU_LIBS)

$(BUILD)/tests/emu/%: EMU_LINK_LIBS = $(EMU_TEST_LIBS)
$(BUILD)/tests/emu/%: $(EMU_DIR)/obj/tests/gpu/%.o $(EMU_TEST_LIBS) $(EMU_SOS)
	$(EMU_LINK)

# ballast-worker of the test build with the emulated CUDA backend, and
# ballast and ballastd beside it (ballast starts the worker next to itself).
EMU_BINS := $(BUILD)/tests/emu/bin/ballast-worker $(BUILD)/tests/emu/bin/ballast $(BUILD)/tests/emu/bin/ballastd
EMU_WORKER_LIBS := $(TEST_LIB) $(subst $(CUDA_LIB),$(EMU_CUDA_LIB),$(WORKER_BIN_LIBS))
$(BUILD)/tests/emu/bin/ballast-worker: EMU_LINK_LIBS = $(EMU_WORKER_LIBS)
$(BUILD)/tests/emu/bin/ballast-worker: $(BUILD)/obj/tests/lib/worker_test_main.o $(EMU_WORKER_LIBS) $(EMU_SOS)
	$(EMU_LINK)
$(BUILD)/tests/emu/bin/ballast $(BUILD)/tests/emu/bin/ballastd: $(BUILD)/tests/emu/bin/%: $(BUILD)/bin/%
	@mkdir -p $(@D)
	$(Q)cp $< $@

# the emulator's own semantics (tests/emu/selftest.cu)
$(EMU_DIR)/obj/tests/emu/selftest.o: $(EMU_DIR)/src/tests/emu/selftest.cu.cc $(EMU_CUH) $(EMU_HDRS)
	@mkdir -p $(@D)
	@echo "  EMU  tests/emu/selftest.cu"
	$(Q)$(EMU_CXX) $(EMU_CXXFLAGS) -c $< -o $@
$(BUILD)/tests/emu/selftest: $(EMU_DIR)/obj/tests/emu/selftest.o $(EMU_LIBDIR)/libcudart.so
	@echo "  LD   $@"
	$(Q)$(EMU_CXX) $(EMU_SAN) -o $@ $< -L$(EMU_LIBDIR) -Wl,-rpath,$(abspath $(EMU_LIBDIR)) -lcudart

# the emulated libraries against independent references, with stubs of the
# runtime's emu_* functions (so without the runtime and without sanitizers:
# its NCCL is loaded into a program that has no ASan runtime)
$(BUILD)/tests/emu/test_emu_libs: tests/emu/test_emu_libs.cc tests/emu/cublaslt.cc $(EMU_HDRS)
	@mkdir -p $(@D)
	@echo "  CXX  $@"
	$(Q)$(EMU_CXX) -std=c++17 -O1 -g -Wall -Wextra -Itests/emu/include -I. -rdynamic tests/emu/test_emu_libs.cc \
	    tests/emu/cublaslt.cc -ldl -o $@
$(EMU_DIR)/plain/libnccl.so.2: tests/emu/nccl.cc $(EMU_HDRS)
	@mkdir -p $(@D)
	@echo "  CXX  $@"
	$(Q)$(EMU_CXX) -std=c++17 -O1 -g -Wall -Wextra -shared -fPIC -Itests/emu/include $< -o $@

# Not in a ThreadSanitizer build (make tsan): the tier is built with ASan,
# and one program cannot hold both runtimes; make asan and make test run it.
ifneq ($(SAN),tsan)
UNIT_TESTS += $(EMU_CHECKS) $(EMU_BINS) $(BUILD)/tests/emu/selftest $(BUILD)/tests/emu/test_emu_libs \
              $(EMU_DIR)/plain/libnccl.so.2
endif
