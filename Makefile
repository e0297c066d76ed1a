# mkserve — build, test and run.
GO      ?= go
BIN     := bin/mkserve
GOFMT   ?= $(shell $(GO) env GOROOT)/bin/gofmt
export CGO_ENABLED := 0

.PHONY: all build test vet run bench fuzz proto kernels device-bins device-old clean

all: build

build:
	$(GO) build -trimpath -buildvcs=auto -o $(BIN) ./cmd/mkserve

vet:
	$(GO) vet ./...
	@unformatted="$$($(GOFMT) -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.dev/*'))" || exit 1; \
	if [ -n "$$unformatted" ]; then echo "gofmt -l: not formatted:"; echo "$$unformatted"; exit 1; fi

# What CI runs (.ci/run): vet and gofmt, then every test under the race detector.
# The race detector's runtime needs cgo (gcc); the code itself never does.
test: vet
	CGO_ENABLED=1 $(GO) test -race -timeout 30m ./...

# Serve the bundled default model: HTTP on 127.0.0.1:8000, gRPC on 127.0.0.1:50051.
run: build
	./$(BIN) serve --log-format console

# Build kernels/libmkernel.so (needs nvcc; see kernels/README.md and scripts/device.sh).
kernels:
	$(MAKE) -C kernels

# The GPU machine has no Go: build here what scripts/device.sh runs there
# (mkserve and the GPU test binaries, CGO_ENABLED=0), packed into one
# archive to carry (.dev/device.tar.xz; the device tool's carry limit is
# 64 MiB with the tree). Then, through the device tool:
#   run  carry: [".dev/device.tar.xz"]  command: bash scripts/device.sh
DEVBIN := .dev/device
# device-old REV=<revision>: the CUDA sources of kernels/ as of REV into
# .dev/old/src; carried to the GPU machine, scripts/device.sh with
# MK_LIB_OLD=.dev/old/src builds .dev/old/libmkernel.so from them, the
# previous build to A/B against in the same call.
device-old:
	@test -n "$(REV)" || { echo "make device-old REV=<git revision>"; exit 1; }
	rm -rf .dev/old/src && mkdir -p .dev/old/src
	git archive "$(REV)" -- 'kernels/*.cu' 'kernels/*.cuh' 'kernels/*.h' | tar -x -C .dev/old/src --strip-components=1

device-bins:
	@mkdir -p $(DEVBIN)
	$(GO) build -trimpath -buildvcs=auto -ldflags='-s -w' -o $(DEVBIN)/mkserve ./cmd/mkserve
	$(GO) test -c -trimpath -ldflags='-s -w' -o $(DEVBIN)/kernels.test ./kernels
	$(GO) test -c -trimpath -ldflags='-s -w' -o $(DEVBIN)/cuda.test ./backend/cuda
	$(GO) test -c -trimpath -ldflags='-s -w' -o $(DEVBIN)/mkserve.test ./cmd/mkserve
	XZ_OPT='-T0 -6' tar -C $(DEVBIN) -cJf .dev/device.tar.xz mkserve kernels.test cuda.test mkserve.test
	@ls -l .dev/device.tar.xz

# Regenerate proto/mkserve/v1 (needs protoc: apt-get install -y protobuf-compiler).
proto:
	bash proto/gen.sh

# CPU benchmarks recorded in docs/PERF.md.
bench:
	$(GO) test -run '^$$' -bench . -benchtime 2s ./linalg ./backend/cpu ./engine

# A short run of every native fuzz target (FUZZTIME each; the targets are
# found in the tracked test files, each run on its own: go test fuzzes one
# target a run). The default is a count of executions, not a duration: with
# a duration Go 1.26's fuzz coordinator can fail a target with a bare
# "context deadline exceeded" at the deadline (golang/go#75804, fixed in Go
# 1.27; seen here on FuzzOpen at FUZZTIME=3s).
FUZZTIME ?= 20000x
fuzz:
	@set -e; for f in $$(git ls-files '*_test.go' | xargs grep -l '^func Fuzz'); do \
		d=./$$(dirname $$f); \
		for n in $$(grep -o '^func Fuzz[A-Za-z0-9_]*' $$f | sed 's/^func //'); do \
			echo "== $$d $$n"; \
			$(GO) test -run '^$$' -fuzz "^$$n\$$" -fuzztime $(FUZZTIME) $$d; \
		done; \
	done

clean:
	rm -rf bin .dev
