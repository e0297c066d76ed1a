// Package mkservev1 is the generated Go code of mkserve/v1/inference.proto,
// the mkserve.v1.Inference gRPC service (regenerate with proto/gen.sh).
package mkservev1
