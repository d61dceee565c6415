# workers/: ballast-worker, the ballast CLI, and the layers they are built
# from. Each folder is one layer and one static library,
# $(BUILD)/lib/libballast_<folder>.a; WORKER_LAYERS lists them from the top
# down, which is also the order a program names them to the linker (a layer
# uses only the layers after it; tests/layers/check.py enforces that on the
# #include graph). docs/workers/<folder>.md says what each one holds.

WORKER_LAYERS := cli train offload ckpt parallel plan model comm data backend

define worker_layer
WLIB_$(1) := $(BUILD)/lib/libballast_$(1).a
$$(WLIB_$(1)): $$(patsubst %.c,$(BUILD)/obj/%.o,$$(wildcard workers/$(1)/*.c))
	@mkdir -p $$(@D)
	@echo "  AR   $$@"
	$(Q)rm -f $$@ && ar rcs $$@ $$^
endef
$(foreach d,$(WORKER_LAYERS),$(eval $(call worker_layer,$(d))))

# every worker layer, top down
WORKER_LIBS := $(foreach d,$(WORKER_LAYERS),$(WLIB_$(d)))

# CUDA backend (workers/backend/cuda/): compiled whenever nvcc is there, so
# every .cu file is checked on machines without a GPU too. Only programs
# that ask for it (ballast-worker, the GPU checks) link it and the CUDA
# libraries.
CUDA_SRCS := $(wildcard workers/backend/cuda/*.cu)
ifeq ($(HAVE_CUDA),1)
CUDA_OBJS += $(patsubst %.cu,$(BUILD)/cuobj/%.o,$(CUDA_SRCS))
CUDA_LIB := $(BUILD)/lib/libballast_cuda.a
$(CUDA_LIB): $(patsubst %.cu,$(BUILD)/cuobj/%.o,$(CUDA_SRCS))
	@mkdir -p $(@D)
	@echo "  AR   $@"
	$(Q)rm -f $@ && ar rcs $@ $^
# headers the .cu files include (nvcc runs without dependency files here)
$(patsubst %.cu,$(BUILD)/cuobj/%.o,$(CUDA_SRCS)): $(wildcard workers/backend/cuda/*.h workers/backend/cuda/*.cuh) workers/backend/backend.h
GPU_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lstdc++
endif

# ---- programs ----
BINS += $(BUILD)/bin/ballast-worker $(BUILD)/bin/ballast

# ballast-worker: the training layers and what they stand on; its malloc is
# jemalloc's (Makefile, JEMALLOC_LIBS).
WORKER_BIN_LIBS := $(WLIB_train) $(WLIB_offload) $(WLIB_ckpt) $(WLIB_parallel) $(WLIB_plan) $(WLIB_model) \
                   $(WLIB_comm) $(WLIB_data) $(WLIB_backend) $(RDZV_LIB) $(COMMON_LIB)
$(BUILD)/bin/ballast-worker: LINK_LIBS = $(WORKER_BIN_LIBS)
$(BUILD)/bin/ballast-worker: MALLOC_LIBS = $(JEMALLOC_LIBS)
$(BUILD)/bin/ballast-worker: $(BUILD)/obj/workers/worker_main.o $(WORKER_BIN_LIBS)
	$(LINK)

# --backend cuda: train.c refers to backend_cuda() weakly, offload/run.c to
# pool_register() (and pool_unregister()); -u pulls them (and the rest of the
# backend) out of libballast_cuda.a for this program only.
ifeq ($(HAVE_CUDA),1)
$(BUILD)/bin/ballast-worker: $(CUDA_LIB)
$(BUILD)/bin/ballast-worker: EXTRA_LIBS += -Wl,-u,backend_cuda -Wl,-u,pool_register $(CUDA_LIB) $(GPU_LIBS)
endif

# ballast: the subcommands, on glibc's malloc (why: Makefile, JEMALLOC_LIBS).
BALLAST_BIN_LIBS := $(WLIB_cli) $(WORKER_BIN_LIBS)
$(BUILD)/bin/ballast: LINK_LIBS = $(BALLAST_BIN_LIBS)
$(BUILD)/bin/ballast: $(BUILD)/obj/workers/ballast_main.o $(BALLAST_BIN_LIBS)
	$(LINK)
# ballast_main.c refers to the cmd_*() functions weakly, and a weak reference
# does not pull a member out of an archive: link the cmd_*.o objects directly.
$(BUILD)/bin/ballast: $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard workers/cli/cmd_*.c))
