# ns-hpc — the two commands a new user needs: `make run` and `make test`.
# Every target installs what it needs first (`make deps`).

PREFIX ?= /usr/local
BUILD  ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS   ?= $(shell nproc)

# Debian 12 packages needed to build, test and run.
DEPS := g++ cmake ninja-build ccache pkg-config \
        nlohmann-json3-dev libtomlplusplus-dev libcli11-dev libspdlog-dev libfmt-dev \
        libboost1.81-dev libseccomp-dev libsqlite3-dev libexpat1-dev libssl-dev libgtest-dev bubblewrap util-linux passwd procps jq \
        mmdebstrap uidmap fakechroot fakeroot dpkg-dev libstb-dev libwebp-dev ripgrep litmus rclone curl \
        passt iproute2

.PHONY: all deps configure build test unit integration test-as-user run bench fuzz install clean

all: build

deps:
	@scripts/deps.sh $(DEPS)
	@# Node.js runs the end-to-end tests (official MCP SDK); any packaged node >= 18 will do.
	@command -v node >/dev/null && command -v npm >/dev/null || scripts/deps.sh nodejs npm

$(BUILD)/build.ninja: CMakeLists.txt | deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

configure: $(BUILD)/build.ninja

build: deps configure
	cmake --build $(BUILD) -j $(JOBS)

# Units and integration tests (real bwrap) as the current user; when run as root, the
# integration suite also runs as an unprivileged user (the HPC login-node case).
test: build
	@# Set-up, like deps: the Debian image and local apt repository the image tests use (cached).
	scripts/test-image.sh $(BUILD)
	cd $(BUILD) && ctest --output-on-failure -j 2

unit: build
	cd $(BUILD) && ctest --output-on-failure -L unit

integration: build
	cd $(BUILD) && ctest --output-on-failure -L integration

run: build
	@scripts/demo.sh $(BUILD)/ns-hpc

bench: build
	$(BUILD)/bench/nshpc_bench 200
	$(BUILD)/bench/nshpc_bench_mcp 200
	$(BUILD)/bench/nshpc_bench_dav $(BUILD)/ns-hpc 5
	tests/e2e/load.mjs --bench
	tests/e2e/install.sh && tests/e2e/bench_files.mjs
	bench/slurm_polls.sh $(BUILD)/ns-hpc
	bench/snapshots.sh $(BUILD)/ns-hpc
	bench/network.sh $(BUILD)/ns-hpc

# libFuzzer over the MCP parser and dispatcher, the HTTP transport and WebDAV requests (paths, If
# headers, XML bodies) (clang, ASan+UBSan), 60 seconds each by default.
FUZZ_SECONDS ?= 60
fuzz: deps
	@scripts/deps.sh clang libclang-rt-14-dev
	cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
	  -DNSHPC_FUZZ=ON -DNSHPC_TESTS=OFF
	cmake --build build-fuzz -j $(JOBS) --target nshpc_fuzz_mcp nshpc_fuzz_http nshpc_fuzz_files nshpc_fuzz_dav
	mkdir -p build-fuzz/corpus-mcp build-fuzz/corpus-http build-fuzz/corpus-files build-fuzz/corpus-dav
	build-fuzz/nshpc_fuzz_mcp -max_total_time=$(FUZZ_SECONDS) -max_len=8192 -print_final_stats=1 \
	  build-fuzz/corpus-mcp tests/fuzz/corpus
	build-fuzz/nshpc_fuzz_http -max_total_time=$(FUZZ_SECONDS) -max_len=16384 -print_final_stats=1 \
	  build-fuzz/corpus-http tests/fuzz/corpus-http
	build-fuzz/nshpc_fuzz_files -max_total_time=$(FUZZ_SECONDS) -max_len=512 -print_final_stats=1 \
	  build-fuzz/corpus-files tests/fuzz/corpus-files
	build-fuzz/nshpc_fuzz_dav -max_total_time=$(FUZZ_SECONDS) -max_len=8192 -print_final_stats=1 \
	  build-fuzz/corpus-dav tests/fuzz/corpus-dav

install: build
	install -s -D -m 0755 $(BUILD)/ns-hpc $(DESTDIR)$(PREFIX)/bin/ns-hpc
	ln -sf ns-hpc $(DESTDIR)$(PREFIX)/bin/mcp-virtual-computer

clean:
	rm -rf $(BUILD)
