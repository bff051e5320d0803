# flexshim build. `make` builds the library and the tool, `make test` every test that runs without
# a GPU (plain, sanitizer and valgrind passes), `make dist` the relocatable bundle for the GPU
# machine, `make install PREFIX=...` installs.

CC        ?= gcc
CUDA_HOME ?= /usr/local/cuda
PREFIX    ?= /usr/local
BUILD     ?= build
SAN       ?=

WARN    := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes
CFLAGS  ?= -O2 -g
CFLAGS  += -std=c11 -D_GNU_SOURCE $(WARN) -fPIC -fvisibility=hidden -pthread \
           -I. -Icore -Ishim -I$(CUDA_HOME)/include
LDLIBS  := -linih -ljansson -ldl -lpthread -lm

ifeq ($(SAN),1)
CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif

CORE_SRC  := $(sort $(wildcard core/*.c) $(wildcard strategies/*.c))
SHIM_SRC  := $(sort $(wildcard shim/*.c))
CORE_OBJ  := $(CORE_SRC:%.c=$(BUILD)/%.o) $(BUILD)/core/fingerprint_ptx.o
NVCC      ?= $(CUDA_HOME)/bin/nvcc
SHIM_OBJ  := $(SHIM_SRC:%.c=$(BUILD)/%.o)
TOOL_OBJ  := $(BUILD)/tools/flexshim-profile.o $(BUILD)/tools/record.o

UNIT_SRC  := $(sort $(wildcard tests/unit/test_*.c))
UNIT_BIN  := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
PRELOAD_PROGS := $(patsubst tests/preload/%.c,$(BUILD)/tests/preload/%,$(sort $(wildcard tests/preload/prog_*.c)))
FAKE_CUDART   := $(BUILD)/tests/fake/libcudart.so.13

LIB  := $(BUILD)/libflexshim.so
CORE_A := $(BUILD)/libflexshim_core.a
TOOL := $(BUILD)/flexshim-profile
SIMDEMO := $(BUILD)/flexshim-simdemo
SAMPLER := $(BUILD)/libfs_sampler.so
ENTRY_PROBE := $(BUILD)/libfs_entry_probe.so

.DEFAULT_GOAL := all

# Debian packages and the CUDA toolkit check (tools/install-deps.sh).
deps:
	tools/install-deps.sh

.PHONY: deps demo all test test-unit test-preload test-tools test-asan test-valgrind dist install clean gpu-build
all: $(LIB) $(TOOL) $(SIMDEMO)

$(BUILD)/%.o: %.c $(wildcard core/*.h shim/*.h strategies/*.h tools/*.h)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c $< -o $@

# The planning code's identity (fs_planner_id): a hash of what a plan is a function of. A run
# plans a saved profile again when its plan carries another.
PLANNER_SRC := $(sort $(wildcard strategies/*.c strategies/*.h)) core/profile.h
PLANNER_ID  := $(shell cat $(PLANNER_SRC) | sha1sum | cut -c1-12)
$(BUILD)/strategies/timeline.o: CFLAGS += -DFS_PLANNER_ID='"$(PLANNER_ID)"'
$(BUILD)/strategies/timeline.o: $(PLANNER_SRC)

# The fingerprint kernel (core/fingerprint.cu) as PTX in a C string; the driver compiles it for the
# GPU at run time. Without nvcc the string is empty and every eviction writes back (slower, same
# results).
$(BUILD)/core/fingerprint_ptx.c: core/fingerprint.cu
	@mkdir -p $(@D)
	@if [ -x "$(NVCC)" ]; then \
	    $(NVCC) -ptx -arch=compute_75 $< -o $(@D)/fingerprint.ptx && \
	    { echo '/* Generated from core/fingerprint.cu by the Makefile. */'; \
	      echo 'extern const char fs_fingerprint_ptx[];'; \
	      echo 'const char fs_fingerprint_ptx[] ='; \
	      sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/    "/' -e 's/$$/\\n"/' $(@D)/fingerprint.ptx; \
	      echo '    "";'; } > $@; \
	else \
	    echo "warning: $(NVCC) not found: built without the fingerprint kernel (evictions always write back)"; \
	    printf 'extern const char fs_fingerprint_ptx[];\nconst char fs_fingerprint_ptx[] = "";\n' > $@; \
	fi

$(BUILD)/core/fingerprint_ptx.o: $(BUILD)/core/fingerprint_ptx.c
	$(CC) $(CFLAGS) -c $< -o $@

$(CORE_A): $(CORE_OBJ)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

# The shared library exports only symbols marked FS_EXPORT (the intercepted CUDA names and the
# public flexshim_* API); no version node, so it interposes on unversioned references.
$(LIB): $(SHIM_OBJ) $(CORE_A)
	$(CC) -shared -Wl,-soname,libflexshim.so -Wl,-z,defs -Wl,-rpath,'$$ORIGIN' $(LDFLAGS) \
	    -o $@ $(SHIM_OBJ) $(CORE_A) $(LDLIBS)

$(TOOL): $(TOOL_OBJ) $(CORE_A)
	$(CC) $(LDFLAGS) -Wl,-rpath,'$$ORIGIN/../lib' -o $@ $(TOOL_OBJ) $(CORE_A) $(LDLIBS)

$(SIMDEMO): $(BUILD)/tools/flexshim-simdemo.o $(CORE_A)
	$(CC) $(LDFLAGS) -o $@ $< $(CORE_A) $(LDLIBS)

# The benchmark's sampling profiler (bench/sampler.c), preloaded beside the shim: the stack of one
# thread in the spans the program marks. Not part of the library.
$(SAMPLER): bench/sampler.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -shared -Wl,-z,defs $(LDFLAGS) -o $@ $< -ldl -lrt -pthread

# The benchmark's entry-point experiment (bench/entry_probe.c): launches seen through wrappers of
# the driver's launch functions instead of CUPTI. Not part of the library.
$(ENTRY_PROBE): bench/entry_probe.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -shared -Wl,-z,defs $(LDFLAGS) -o $@ $< -ldl -pthread

# The main job: on a GPU machine a CUDA program under the shim (tests/gpu/run.sh, step b), else
# the engine on the simulated device.
demo: all
	@if nvidia-smi -L >/dev/null 2>&1; then \
	    $(MAKE) dist && OUT=$${OUT:-/tmp/flexshim-demo} STEPS_ONLY=b bash tests/gpu/run.sh; \
	else \
	    echo "demo: no GPU on this machine (nvidia-smi finds none): running the engine on the simulated device"; \
	    $(SIMDEMO); \
	fi

# ---- tests ---------------------------------------------------------------------------------
$(BUILD)/tests/%: tests/unit/%.c $(CORE_A) tests/unit/test_util.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Itests/unit $(LDFLAGS) -o $@ $< $(CORE_A) -lcmocka $(LDLIBS)

# A stand-in for libcudart (soname libcudart.so.13): lets preload tests run with no GPU.
$(FAKE_CUDART): tests/preload/fake_cudart.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -fvisibility=default -shared -Wl,-soname,libcudart.so.13 -o $@ $<
	ln -sf libcudart.so.13 $(@D)/libcudart.so

$(BUILD)/tests/preload/%: tests/preload/%.c $(FAKE_CUDART)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< -L$(BUILD)/tests/fake -lcudart -Wl,-rpath,'$$ORIGIN/../fake'

test-unit: $(UNIT_BIN)
	BUILD=$(BUILD) SAN=$(SAN) tests/run_unit.sh $(UNIT_BIN)

test-preload: $(LIB) $(TOOL) $(PRELOAD_PROGS)
	BUILD=$(BUILD) SAN=$(SAN) tests/preload/run.sh

test-tools: $(TOOL)
	BUILD=$(BUILD) SAN=$(SAN) tests/tools/run.sh

# Everything that runs without a GPU: plain build, then ASan+UBSan, then valgrind on the
# simulated-device tests. tests/gpu/ needs the GPU machine (tests/gpu/run.sh).
test:
	@echo "tests/gpu: skipped here (they need the GPU machine: tests/gpu/run.sh)"
	$(MAKE) test-unit test-preload test-tools
	$(MAKE) BUILD=build/asan SAN=1 test-unit test-preload test-tools
	$(MAKE) test-valgrind

test-valgrind: $(UNIT_BIN)
	BUILD=$(BUILD) tests/run_unit.sh --valgrind $(UNIT_BIN)

# ---- bundle for the GPU machine and installation -------------------------------------------
dist: all $(SAMPLER) $(ENTRY_PROBE)
	rm -rf dist && mkdir -p dist/lib dist/bin dist/etc dist/include
	cp $(LIB) dist/lib/
	cp $(SAMPLER) $(ENTRY_PROBE) dist/lib/
	cp $(TOOL) $(SIMDEMO) dist/bin/
	cp conf/flexshim.ini dist/etc/
	cp shim/flexshim.h dist/include/
	for l in $$(ldd $(LIB) | awk '/libinih|libjansson/ {print $$3}'); do cp -L $$l dist/lib/; done
	tests/gpu/build.sh $(BUILD) dist/bin/gpu-tests
	# What the bundle was built from (the GPU machine's copy of the tree may not know).
	git describe --always --dirty > dist/COMMIT 2>/dev/null || echo unknown > dist/COMMIT
	@echo "dist/: $$(ls dist/lib dist/bin | tr '\n' ' ')"

install: all
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/etc/flexshim \
	    $(DESTDIR)$(PREFIX)/include
	install -m 755 $(LIB) $(DESTDIR)$(PREFIX)/lib/
	install -m 755 $(TOOL) $(DESTDIR)$(PREFIX)/bin/
	install -m 644 conf/flexshim.ini $(DESTDIR)$(PREFIX)/etc/flexshim/
	install -m 644 shim/flexshim.h $(DESTDIR)$(PREFIX)/include/

clean:
	rm -rf build dist
