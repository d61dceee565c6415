# workers/: ballast-worker, the ballast CLI, and the library they share.
# Every workers/*.c except the *_main.c files goes into libballast_worker.a.

WORKER_SRCS := $(filter-out %_main.c,$(wildcard workers/*.c))
WORKER_OBJS := $(patsubst %.c,$(BUILD)/obj/%.o,$(WORKER_SRCS))
WORKER_LIB  := $(BUILD)/lib/libballast_worker.a

$(WORKER_LIB): $(WORKER_OBJS)
	@mkdir -p $(@D)
	@echo "  AR   $@"
	$(Q)rm -f $@ && ar rcs $@ $^

LIBS := $(WORKER_LIB) $(LIBS)

# CUDA backend: compiled whenever nvcc is there, so every .cu file is checked
# on machines without a GPU too.
CUDA_SRCS := $(wildcard workers/backend_cuda/*.cu)
ifeq ($(HAVE_CUDA),1)
CUDA_OBJS += $(patsubst %.cu,$(BUILD)/cuobj/%.o,$(CUDA_SRCS))
# libballast_cuda.a holds the backend; only programs that ask for it (the
# GPU checks, and ballast-worker for --backend cuda) link it and the CUDA
# libraries. Everything else stays free of CUDA.
CUDA_LIB := $(BUILD)/lib/libballast_cuda.a
$(CUDA_LIB): $(patsubst %.cu,$(BUILD)/cuobj/%.o,$(CUDA_SRCS))
	@mkdir -p $(@D)
	@echo "  AR   $@"
	$(Q)rm -f $@ && ar rcs $@ $^
# headers the .cu files include (nvcc runs without dependency files here)
$(patsubst %.cu,$(BUILD)/cuobj/%.o,$(CUDA_SRCS)): workers/backend_cuda/common.cuh workers/backend_cuda/backend_cuda.h workers/backend.h
GPU_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublasLt -lstdc++
endif

WORKER_MAINS := $(wildcard workers/*_main.c)
BINS += $(patsubst workers/%_main.c,$(BUILD)/bin/%,$(WORKER_MAINS))

$(BUILD)/bin/%: $(BUILD)/obj/workers/%_main.o $(LIBS)
	$(LINK)

# ballast_main.c refers to the cmd_*() functions weakly, and a weak reference
# does not pull a member out of an archive: link the cmd_*.o objects directly.
$(BUILD)/bin/ballast: $(patsubst %.c,$(BUILD)/obj/%.o,$(wildcard workers/cmd_*.c))

# ballast-worker's main is workers/worker_main.c.
BINS := $(filter-out $(BUILD)/bin/worker,$(BINS)) $(if $(wildcard workers/worker_main.c),$(BUILD)/bin/ballast-worker)
$(BUILD)/bin/ballast-worker: $(BUILD)/obj/workers/worker_main.o $(LIBS)
	$(LINK)

# --backend cuda: train.c refers to backend_cuda() weakly, offload_run.c to
# pool_register() (and pool_unregister()); -u pulls them (and the rest of the
# backend) out of libballast_cuda.a for this program only.
ifeq ($(HAVE_CUDA),1)
$(BUILD)/bin/ballast-worker: $(CUDA_LIB)
$(BUILD)/bin/ballast-worker: EXTRA_LIBS += -Wl,-u,backend_cuda -Wl,-u,pool_register $(CUDA_LIB) $(GPU_LIBS)
endif
