# services/probe/: ballast-probe, the health probe the container images use
# (Docker HEALTHCHECK, compose healthcheck). One program, main.c.

ifneq ($(wildcard services/probe/main.c),)
BINS += $(BUILD)/bin/ballast-probe
endif

$(BUILD)/bin/ballast-probe: $(BUILD)/obj/services/probe/main.o $(LIBS)
	$(LINK)
