# ns-hpc — the two commands a new user needs: `make run` and `make test`.
# Every target installs what it needs first (`make deps`).

PREFIX ?= /usr/local
BUILD  ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS   ?= $(shell nproc)

# Debian 12 packages by purpose. The build and run groups are all that `make build` and the server
# need: a normal user (an HPC login node) who has them builds and runs ns-hpc. Each optional
# feature's group is installed by `make run` and `make test` when they run as root; a normal user
# is shown the one line to ask an administrator for, and `ns-hpc doctor` names what a feature lacks.
DEPS_BUILD  := g++ cmake ninja-build ccache pkg-config nlohmann-json3-dev libtomlplusplus-dev libcli11-dev \
               libspdlog-dev libfmt-dev libboost1.81-dev libseccomp-dev libsqlite3-dev libexpat1-dev libssl-dev \
               libstb-dev libwebp-dev libxcb1-dev libxcb-xtest0-dev x11proto-dev libturbojpeg0-dev libpng-dev
DEPS_RUN    := bubblewrap util-linux passwd procps iproute2
DEPS_IMAGES := mmdebstrap uidmap fakechroot fakeroot dpkg-dev
DEPS_NAT    := passt
DEPS_SEARCH := ripgrep
# Desktops on the host's root ([desktop] host_root = true; its tests): the session's programs
# (src/desktop/session.cpp), AT-SPI for the accessibility tree, the X tools scripts call, and
# GTK for python3 (the desktop tests' own window).
DEPS_DESKTOP := xvfb xauth xfce4-session xfwm4 xfce4-panel xfdesktop4 xfce4-settings xfce4-terminal thunar mousepad \
               xfconf dbus dbus-x11 at-spi2-core python3-pyatspi python3-gi gir1.2-atspi-2.0 x11vnc \
               fonts-dejavu-core fonts-noto-color-emoji librsvg2-common xdotool scrot imagemagick wmctrl x11-utils \
               xclip xdg-utils gir1.2-gtk-3.0
DEPS_OPTIONAL := $(DEPS_IMAGES) $(DEPS_NAT) $(DEPS_SEARCH) $(DEPS_DESKTOP)
# The tests: GoogleTest, the tools they drive (litmus, rclone, curl, jq), Node.js for the
# end-to-end tests (official MCP SDK; any packaged node >= 18 will do) and the browser the
# dashboard's tests drive (with playwright-core from npm).
DEPS_TEST   := libgtest-dev jq litmus rclone curl chromium-headless-shell

.PHONY: all deps deps-build deps-run deps-optional deps-test deps-ui configure build test test-build unit integration \
        test-as-user run demo bench fuzz install clean

all: build

# What `make build` needs; missing run packages are named, not required, to build.
deps-build:
	@scripts/deps.sh $(DEPS_BUILD)
deps-run:
	@scripts/deps.sh $(DEPS_RUN)
deps-optional:
	@scripts/deps.sh --optional $(DEPS_OPTIONAL)
# The dashboard's live desktop and terminal (noVNC, xterm.js from npm, pinned); without npm the
# build goes on and the page says they are not built in.
deps-ui:
	@command -v npm >/dev/null || scripts/deps.sh --optional nodejs npm
	@scripts/ui-vendor.sh
deps-test:
	@scripts/deps.sh $(DEPS_TEST)
	@command -v node >/dev/null && command -v npm >/dev/null || scripts/deps.sh nodejs npm
# Everything: what make run and make test install.
deps: deps-build deps-run deps-optional deps-test deps-ui

$(BUILD)/build.ninja: CMakeLists.txt | deps-build
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

configure: $(BUILD)/build.ninja

build: deps-build deps-ui configure
	@scripts/deps.sh --optional $(DEPS_RUN)
	cmake --build $(BUILD) -j $(JOBS)

# Units and integration tests (real bwrap) as the current user; when run as root, the
# integration suite also runs as an unprivileged user (the HPC login-node case).
test: deps
	@# The tests are configured only where GoogleTest is installed: again now that it is.
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)
	@# Set-up, like deps: the Debian image and local apt repository the image tests use (cached).
	scripts/test-image.sh $(BUILD)
	@# Every suite, then a check that the tests left nothing of ours running.
	scripts/run-tests.sh $(BUILD)

unit: test-build
	cd $(BUILD) && ctest --output-on-failure -L unit

integration: test-build
	cd $(BUILD) && ctest --output-on-failure -L integration

test-build: deps-build deps-test
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

# The server on loopback with WebDAV and the dashboard, in the foreground (Ctrl-C ends it).
run: deps-build deps-run deps-optional deps-ui configure
	cmake --build $(BUILD) -j $(JOBS)
	@scripts/run.sh $(BUILD)/ns-hpc

# A walkthrough on the command line: an instance, a hardened sandbox, an image root.
demo: deps-build deps-run deps-optional configure
	cmake --build $(BUILD) -j $(JOBS)
	@scripts/demo.sh $(BUILD)/ns-hpc

bench: build
	$(BUILD)/bench/nshpc_bench 200
	$(BUILD)/bench/nshpc_bench_mcp 200
	$(BUILD)/bench/nshpc_bench_dav $(BUILD)/ns-hpc 5
	$(BUILD)/bench/nshpc_bench_desktop 100
	tests/e2e/load.mjs --bench
	tests/e2e/install.sh && tests/e2e/bench_files.mjs
	tests/e2e/bench_eras.mjs
	tests/e2e/bench_desktop.mjs 100
	tests/e2e/bench_dashboard.mjs
	tests/e2e/bench_live.mjs
	bench/desktop.sh $(BUILD)/ns-hpc
	bench/slurm_polls.sh $(BUILD)/ns-hpc
	bench/snapshots.sh $(BUILD)/ns-hpc
	bench/network.sh $(BUILD)/ns-hpc

# libFuzzer over the MCP parser and dispatcher, the HTTP transport and WebDAV requests (paths, If
# headers, XML bodies) (clang, ASan+UBSan), 60 seconds each by default.
FUZZ_SECONDS ?= 60
fuzz: deps-build
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
