package grpcapi

import (
	"context"
	"testing"
	"time"

	pb "github.com/mkserve/mkserve/proto/mkserve/v1"
)

// BenchmarkPrepare is the per-request server work before the engine:
// tokenizing a ~60-token text prompt, defaults and validation.
func BenchmarkPrepare(b *testing.B) {
	tok := loadTok(b)
	s := New(newFake(4096, tok.VocabSize()), tok, Options{})
	req := &pb.GenerateRequest{
		Prompt:   &pb.GenerateRequest_Text{Text: "The mixture of experts routes each token to a few feed-forward networks, chosen by a learned router; only those experts run, so a model with many parameters costs little per token."},
		Sampling: &pb.SamplingParams{MaxTokens: ptr(int32(64)), Temperature: ptr(float32(0.7)), Stop: []string{"\n\n"}},
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.prepare(req, nil, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGenerateLoopback is one unary call of 16 tokens through a real
// 127.0.0.1 connection with a no-delay fake engine: the adapter's and
// gRPC's overhead per request.
func BenchmarkGenerateLoopback(b *testing.B) {
	tok := loadTok(b)
	h := start(b, newFake(4096, tok.VocabSize()), Options{})
	req := &pb.GenerateRequest{
		Prompt:   &pb.GenerateRequest_TokenIds{TokenIds: &pb.TokenIds{Ids: []int32{1, 2, 3, 4, 5, 6, 7, 8}}},
		Sampling: &pb.SamplingParams{MaxTokens: ptr(int32(16))},
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := h.client.Generate(context.Background(), req); err != nil {
			b.Fatal(err)
		}
	}
}
