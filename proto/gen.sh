#!/usr/bin/env bash
# Regenerates the Go code of proto/mkserve/v1 from inference.proto.
# Needs protoc (Debian: apt-get install -y protobuf-compiler); installs the
# Go plugins at the versions that match go.mod when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PROTOC_GEN_GO_VERSION=v1.36.12     # = google.golang.org/protobuf in go.mod
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2  # generated code needs grpc ≥ 1.64 (go.mod: v1.85.0)

command -v protoc >/dev/null || { echo "gen.sh: protoc not found (apt-get install -y protobuf-compiler)" >&2; exit 1; }
bin="$(go env GOPATH)/bin"
want() { # plugin version: installs plugin unless it reports version
	[[ -x "$bin/$1" ]] && "$bin/$1" --version 2>&1 | grep -q -- "${2#v}"
}
want protoc-gen-go "$PROTOC_GEN_GO_VERSION" ||
	GOFLAGS= go install "google.golang.org/protobuf/cmd/protoc-gen-go@$PROTOC_GEN_GO_VERSION"
want protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION" ||
	GOFLAGS= go install "google.golang.org/grpc/cmd/protoc-gen-go-grpc@$PROTOC_GEN_GO_GRPC_VERSION"

PATH="$bin:$PATH" protoc -I proto \
	--go_out=. --go_opt=module=github.com/mkserve/mkserve \
	--go-grpc_out=. --go-grpc_opt=module=github.com/mkserve/mkserve \
	proto/mkserve/v1/inference.proto
gofmt -l proto/mkserve/v1 | (! grep .) || { echo "gen.sh: generated code not gofmt-clean" >&2; exit 1; }
