# workers/: ballast-worker, the ballast CLI, and the layers they are built
# from. Each folder is one layer and one static library,
# $(BUILD)/lib/libballast_<folder>.a; WORKER_LAYERS lists them from the top
# down, which is also the order a program names them to the linker (a layer
# uses only the layers after it; tests/layers/check.py enforces that on the
# #include graph). docs/workers/<folder>.md says what each one holds.

WORKER_LAYERS := cli train offload ckpt parallel plan model comm data backend

define worker_layer
WLIB_$(1) := $(BUILD)/lib/libballast_$(1).a
$$(WLIB_$(1)): $$(patsubst %.c,$(BUILD)/obj/%.o,$$(wildcard workers/$(1)/*.c)) \
               $$(patsubst %.cc,$(BUILD)/obj/%.o,$$(wildcard workers/$(1)/*.cc))
	@mkdir -p $$(@D)
	@echo "  AR   $$@"
	$(Q)rm -f $$@ && ar rcs $$@ $$^
endef
$(foreach d,$(WORKER_LAYERS),$(eval $(call worker_layer,$(d))))

# every worker layer, top down
WORKER_LIBS := $(foreach d,$(WORKER_LAYERS),$(WLIB_$(d)))

# CUDA backend (workers/backend/cuda/): libballast_cuda.a. With nvcc every
# .cu file is compiled (so they are checked on machines without a GPU too)
# and the programs that link it also link the CUDA libraries; without nvcc
# it holds workers/backend/cuda/none.c, whose entry points say the build has
# no CUDA backend. Either way backend_open (workers/backend/open.c) links the
# same.
CUDA_SRCS := $(wildcard workers/backend/cuda/*.cu)
CUDA_LIB  := $(BUILD)/lib/libballast_cuda.a
ifeq ($(HAVE_CUDA),1)
CUDA_OBJS += $(patsubst %.cu,$(BUILD)/cuobj/%.o,$(CUDA_SRCS))
CUDA_LIB_OBJS := $(CUDA_OBJS)
# headers the .cu files include (nvcc runs without dependency files here)
$(CUDA_OBJS): $(wildcard workers/backend/cuda/*.h workers/backend/cuda/*.cuh) workers/backend/backend.h
GPU_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lstdc++
else
CUDA_LIB_OBJS := $(BUILD)/obj/workers/backend/cuda/none.o
GPU_LIBS :=
endif
$(CUDA_LIB): $(CUDA_LIB_OBJS)
	@mkdir -p $(@D)
	@echo "  AR   $@"
	$(Q)rm -f $@ && ar rcs $@ $^

# ---- programs ----
BINS += $(BUILD)/bin/ballast-worker $(BUILD)/bin/ballast

# ballast-worker: the training layers and what they stand on; its malloc is
# jemalloc's (Makefile, JEMALLOC_LIBS).
WORKER_BIN_LIBS := $(WLIB_train) $(WLIB_offload) $(WLIB_ckpt) $(WLIB_parallel) $(WLIB_plan) $(WLIB_model) \
                   $(WLIB_comm) $(WLIB_data) $(WLIB_backend) $(CUDA_LIB) $(RDZV_LIB) $(COMMON_LIB)
$(BUILD)/bin/ballast-worker: LINK_LIBS = $(WORKER_BIN_LIBS) $(GPU_LIBS)
$(BUILD)/bin/ballast-worker: MALLOC_LIBS = $(JEMALLOC_LIBS)
$(BUILD)/bin/ballast-worker: $(BUILD)/obj/workers/worker_main.o $(WORKER_BIN_LIBS)
	$(LINK)

# ballast: the subcommands and the layers they use (ballast train starts
# ballast-worker processes; eval and generate compute in process, generate
# also on the CUDA backend), on glibc's malloc (why: Makefile, JEMALLOC_LIBS).
BALLAST_BIN_LIBS := $(WLIB_cli) $(WLIB_offload) $(WLIB_ckpt) $(WLIB_parallel) $(WLIB_plan) $(WLIB_model) \
                    $(WLIB_comm) $(WLIB_data) $(WLIB_backend) $(CUDA_LIB) $(RDZV_LIB) $(COMMON_LIB)
$(BUILD)/bin/ballast: LINK_LIBS = $(BALLAST_BIN_LIBS) $(GPU_LIBS)
$(BUILD)/bin/ballast: MALLOC_LIBS =
$(BUILD)/bin/ballast: $(BUILD)/obj/workers/ballast_main.o $(BALLAST_BIN_LIBS)
	$(LINK)
