# mkserve — build, test and run.
GO      ?= go
BIN     := bin/mkserve
export CGO_ENABLED := 0

# The model `make run` uses until the trained default model lands.
RUN_MODEL  ?= models/testdata/golden/qwen3_moe
RUN_PROMPT ?= Once upon a time

.PHONY: all build test vet run bench fuzz golden clean

all: build

build:
	$(GO) build -trimpath -o $(BIN) ./cmd/mkserve

vet:
	$(GO) vet ./...

# What CI runs (.ci/run): vet, then every test under the race detector.
test: vet
	$(GO) test -race -timeout 30m ./...

run: build
	./$(BIN) generate --model $(RUN_MODEL) --prompt "$(RUN_PROMPT)" --max-tokens 24

# CPU benchmarks recorded in docs/PERF.md.
bench:
	$(GO) test -run '^$$' -bench . -benchtime 2s ./linalg ./backend/cpu ./models

# A short run of every native fuzz target.
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzOpen -fuzztime 30s ./models/safetensors
	$(GO) test -run '^$$' -fuzz FuzzParseConfig -fuzztime 30s ./models

clean:
	rm -rf bin .dev
