package grpcapi

import (
	"errors"
	"math"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/mkserve/mkserve/engine"
	pb "github.com/mkserve/mkserve/proto/mkserve/v1"
)

func nan() float64 { return math.NaN() }
func inf() float64 { return math.Inf(1) }

// FuzzValidate decodes arbitrary bytes as a GenerateRequest and runs the
// server's validation on it: it must not panic; a rejection must map to
// InvalidArgument; an accepted request must satisfy every limit, checked
// here independently of validate.go.
func FuzzValidate(f *testing.F) {
	seeds := []*pb.GenerateRequest{
		{Prompt: &pb.GenerateRequest_Text{Text: "Once upon a time"}},
		{Prompt: &pb.GenerateRequest_TokenIds{TokenIds: &pb.TokenIds{Ids: []int32{1, 2, 3}}}, RequestId: "r1",
			Sampling: &pb.SamplingParams{N: ptr(int32(2)), MaxTokens: ptr(int32(8)), Temperature: ptr(float32(0.7)),
				TopP: ptr(float32(0.9)), TopK: ptr(int32(-1)), Logprobs: true, TopLogprobs: ptr(int32(5)),
				Stop: []string{"\n\n"}, StopTokenIds: []int32{151645}, Seed: ptr(uint64(7))}},
		{Prompt: &pb.GenerateRequest_TokenIds{TokenIds: &pb.TokenIds{Ids: []int32{-1}}}},
		{Prompt: &pb.GenerateRequest_Text{Text: "x"}, Sampling: &pb.SamplingParams{Temperature: ptr(float32(math.NaN()))}},
		{Prompt: &pb.GenerateRequest_Text{Text: "x"}, Sampling: &pb.SamplingParams{MaxTokens: ptr(int32(math.MaxInt32))}},
		{Prompt: &pb.GenerateRequest_Text{Text: "<|im_start|>user\nhi<|im_end|>"}, AddSpecialTokens: ptr(false),
			Sampling: &pb.SamplingParams{RepetitionPenalty: ptr(float32(2)), MinP: ptr(float32(1)), PresencePenalty: ptr(float32(-2))}},
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	tok := loadTok(f)
	const maxCtx = 4096
	srv := New(newFake(maxCtx, tok.VocabSize()), tok, Options{})
	vocab := int32(tok.VocabSize())
	f.Fuzz(func(t *testing.T, data []byte) {
		var req pb.GenerateRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		p, err := srv.prepare(&req, nil, time.Now())
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) && !errors.Is(err, engine.ErrTooLong) {
				t.Fatalf("rejection %v is neither a FieldError nor ErrTooLong", err)
			}
			if st := status.Convert(ToStatus(err)); st.Code() != codes.InvalidArgument {
				t.Fatalf("rejection %v maps to %v", err, st.Code())
			}
			return
		}
		sp := p.req.Sampling
		bad := func(what string) { t.Fatalf("accepted %s: %+v", what, sp) }
		if len(p.req.Prompt) == 0 || len(p.req.Prompt)+sp.MaxTokens > maxCtx {
			bad("a prompt that does not fit")
		}
		for _, id := range p.req.Prompt {
			if id < 0 || id >= vocab {
				bad("an out-of-vocabulary prompt token")
			}
		}
		if sp.N < 1 || sp.N > 128 || sp.MaxTokens < 1 || sp.TopK < 0 || sp.TopLogprobs < 0 || sp.TopLogprobs > 20 {
			bad("an integer out of range")
		}
		if sp.TopLogprobs > 0 && !sp.Logprobs {
			bad("top_logprobs without logprobs")
		}
		in := func(v float32, lo, hi float64, loOpen bool) bool {
			x := float64(v)
			return !math.IsNaN(x) && x <= hi && (x > lo || !loOpen && x == lo)
		}
		if !in(sp.Temperature, 0, 2, false) || !in(sp.TopP, 0, 1, true) || !in(sp.MinP, 0, 1, false) ||
			!in(sp.PresencePenalty, -2, 2, false) || !in(sp.FrequencyPenalty, -2, 2, false) ||
			!in(sp.RepetitionPenalty, 0, MaxRepetitionPenalty, true) {
			bad("a float out of range")
		}
		if len(sp.Stop) > 4 {
			bad("too many stop strings")
		}
		for _, s := range sp.Stop {
			if s == "" || len(s) > 256 || !utf8.ValidString(s) {
				bad("a bad stop string")
			}
		}
		for _, id := range sp.StopTokenIDs {
			if id < 0 || id >= vocab {
				bad("an out-of-vocabulary stop token")
			}
		}
		if len(p.clientID) > 256 || p.clientID == "" {
			bad("a bad request id")
		}
		if req.Sampling != nil && req.Sampling.Temperature != nil && *req.Sampling.Temperature != sp.Temperature {
			bad("a changed temperature")
		}
	})
}
