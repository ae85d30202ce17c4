# ns-hpc — the two commands a new user needs: `make run` and `make test`.
# Every target installs what it needs first (`make deps`).

PREFIX ?= /usr/local
BUILD  ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS   ?= $(shell nproc)

# Debian 12 packages needed to build, test and run.
DEPS := g++ cmake ninja-build ccache pkg-config \
        nlohmann-json3-dev libtomlplusplus-dev libcli11-dev libspdlog-dev libfmt-dev \
        libseccomp-dev libgtest-dev bubblewrap util-linux passwd procps

.PHONY: all deps configure build test unit integration test-as-user run bench install clean

all: build

deps:
	@scripts/deps.sh $(DEPS)

$(BUILD)/build.ninja: CMakeLists.txt | deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

configure: $(BUILD)/build.ninja

build: deps configure
	cmake --build $(BUILD) -j $(JOBS)

# Units and integration tests (real bwrap) as the current user; when run as root, the
# integration suite also runs as an unprivileged user (the HPC login-node case).
test: build
	cd $(BUILD) && ctest --output-on-failure -j 2

unit: build
	cd $(BUILD) && ctest --output-on-failure -L unit

integration: build
	cd $(BUILD) && ctest --output-on-failure -L integration

run: build
	@scripts/demo.sh $(BUILD)/ns-hpc

bench: build
	$(BUILD)/bench/nshpc_bench 200

install: build
	install -s -D -m 0755 $(BUILD)/ns-hpc $(DESTDIR)$(PREFIX)/bin/ns-hpc

clean:
	rm -rf $(BUILD)
