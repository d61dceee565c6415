# tests/gpu/: the GPU checks (check_*.c, one per op family of the CUDA
# backend, against the CPU oracle) and the GPU training program
# (gpu_train.c). Built only when nvcc is there (HAVE_CUDA=1); they link
# libballast_cuda.a and the CUDA libraries, nothing else does.
# tests/integration/gpu_checks.sh runs them under `make test` (they report
# "SKIP no GPU" on machines without one); tests/gpu/run.sh builds and runs
# them on a GPU machine without this Makefile.

ifeq ($(HAVE_CUDA),1)
GPU_PROGS  := $(patsubst tests/gpu/%.c,$(BUILD)/tests/gpu/%,$(wildcard tests/gpu/*.c))
UNIT_TESTS += $(GPU_PROGS)

$(BUILD)/tests/gpu/%: $(BUILD)/obj/tests/gpu/%.o $(TEST_LIBS) $(CUDA_LIB)
	$(LINK) $(CUDA_LIB) $(GPU_LIBS)
endif

# The checks that use the CUDA runtime directly (pool copies, NCCL streams)
# need its header.
ifeq ($(HAVE_CUDA),1)
$(BUILD)/obj/tests/gpu/%.o: CFLAGS += -I$(CUDA_HOME)/include
endif
