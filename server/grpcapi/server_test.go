package grpcapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/mkserve/mkserve/engine"
	pb "github.com/mkserve/mkserve/proto/mkserve/v1"
	"github.com/mkserve/mkserve/tokenizer"
)

const tokDir = "../../models/testdata/golden/qwen3_moe"

var (
	tokOnce sync.Once
	tokVal  *tokenizer.Tokenizer
	tokErr  error
)

func loadTok(t testing.TB) *tokenizer.Tokenizer {
	t.Helper()
	tokOnce.Do(func() { tokVal, tokErr = tokenizer.LoadDir(tokDir) })
	if tokErr != nil {
		t.Fatal(tokErr)
	}
	return tokVal
}

func newRand(t testing.TB) *rand.Rand {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, seed>>7|1))
}

var words = []string{"the", "mixture", "of", "experts", "routes", "each", "token", "to", "a", "few",
	"feed-forward", "networks", "Once", "upon", "time", "42", "über", "日本語", "!", "\n", "  "}

func randText(r *rand.Rand) string {
	var b strings.Builder
	for i := range 1 + r.IntN(20) {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[r.IntN(len(words))])
	}
	return b.String()
}

// harness is a Server on a real 127.0.0.1 listener and a client to it.
type harness struct {
	fake   *fakeGen
	srv    *Server
	reg    *prometheus.Registry
	logs   *observer.ObservedLogs
	conn   *grpc.ClientConn
	client pb.InferenceClient
}

func start(t testing.TB, fake *fakeGen, opts Options) *harness {
	t.Helper()
	h := &harness{fake: fake, reg: prometheus.NewRegistry()}
	core, logs := observer.New(zapcore.DebugLevel)
	h.logs = logs
	opts.Logger = zap.New(core)
	opts.Registerer = h.reg
	h.srv = New(fake, loadTok(t), opts)
	gs := grpc.NewServer(h.srv.ServerOptions()...)
	h.srv.Register(gs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	h.conn, err = grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.conn.Close() })
	h.client = pb.NewInferenceClient(h.conn)
	return h
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func ptr[T any](v T) *T { return &v }

// randSampling is random valid sampling settings (max_tokens small).
func randSampling(r *rand.Rand, vocab int) *pb.SamplingParams {
	sp := &pb.SamplingParams{
		N:           ptr(int32(1 + r.IntN(3))),
		MaxTokens:   ptr(int32(1 + r.IntN(12))),
		Temperature: ptr(float32(r.IntN(200)) / 100),
		TopP:        ptr(float32(1+r.IntN(100)) / 100),
		TopK:        ptr(int32(r.IntN(50))),
		MinP:        ptr(float32(r.IntN(100)) / 100),
		Seed:        ptr(r.Uint64()),
		Logprobs:    r.IntN(2) == 0,
		JsonObject:  r.IntN(4) == 0,

		KeepSpecialTokens: r.IntN(2) == 0,
	}
	if r.IntN(4) == 0 {
		sp.JsonSchema = `{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}`
	} else if !sp.JsonObject && r.IntN(4) == 0 {
		sp.Regex = `[0-9]+(yes|no)`
	}
	if sp.Logprobs {
		sp.TopLogprobs = ptr(int32(r.IntN(5)))
	}
	if r.IntN(2) == 0 {
		// A stop token some choice is likely to hit: a token the fake
		// makes at random is unlikely, so take one from the vocabulary
		// and rely on the stop rule being exercised in TestStopToken.
		sp.StopTokenIds = []int32{int32(r.IntN(vocab))}
	}
	return sp
}

// engineSampling is the engine settings the server should derive from sp.
// Unset fields take the documented defaults; max_tokens must be set.
func engineSampling(sp *pb.SamplingParams) engine.SamplingParams {
	def := func(v *float32, d float32) float32 {
		if v == nil {
			return d
		}
		return *v
	}
	n := 1
	if sp.N != nil {
		n = int(*sp.N)
	}
	return engine.SamplingParams{
		N: n, MaxTokens: int(sp.GetMaxTokens()), Temperature: def(sp.Temperature, 1),
		TopP: def(sp.TopP, 1), TopK: int(sp.GetTopK()), MinP: sp.GetMinP(), Seed: sp.Seed,
		RepetitionPenalty: 1, StopTokenIDs: sp.StopTokenIds, Logprobs: sp.GetLogprobs(),
		TopLogprobs: int(sp.GetTopLogprobs()),
	}
}

func checkChoices(t *testing.T, where string, got []*pb.Choice, want []wantChoice, sp engine.SamplingParams) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d choices, want %d", where, len(got), len(want))
	}
	for i, c := range got {
		w := want[i]
		if int(c.Index) != i || !slices.Equal(c.TokenIds, w.ids) || c.Text != w.text || c.FinishReason != w.finish {
			t.Errorf("%s: choice %d = {%d %v %q %s}, want {%d %v %q %s}", where, i,
				c.Index, c.TokenIds, c.Text, c.FinishReason, i, w.ids, w.text, w.finish)
			continue
		}
		if !sp.Logprobs {
			if len(c.Logprobs) != 0 {
				t.Errorf("%s: choice %d has logprobs not asked for", where, i)
			}
			continue
		}
		if len(c.Logprobs) != len(w.ids) {
			t.Fatalf("%s: choice %d: %d logprobs for %d tokens", where, i, len(c.Logprobs), len(w.ids))
		}
		for k, lp := range c.Logprobs {
			if lp.TokenId != w.ids[k] || lp.Logprob != w.lps[k] || lp.Text != fakeText(w.ids[k]) || len(lp.Top) != sp.TopLogprobs {
				t.Errorf("%s: choice %d logprob %d = %v, want id %d logprob %v with %d top", where, i, k, lp, w.ids[k], w.lps[k], sp.TopLogprobs)
			}
		}
	}
}

func totalTokens(want []wantChoice) int {
	n := 0
	for _, w := range want {
		n += len(w.ids)
	}
	return n
}

func TestGenerate(t *testing.T) {
	r := newRand(t)
	tok := loadTok(t)
	h := start(t, newFake(4096, tok.VocabSize()), Options{})
	h.srv.SetServing(true)
	for i := range 12 {
		text := randText(r)
		sp := randSampling(r, tok.VocabSize())
		req := &pb.GenerateRequest{Prompt: &pb.GenerateRequest_Text{Text: text}, Sampling: sp, Priority: int32(r.IntN(3))}
		prompt, err := tok.Encode(text, true)
		if err != nil {
			t.Fatal(err)
		}
		if i%2 == 1 { // the same prompt as token ids
			req.Prompt = &pb.GenerateRequest_TokenIds{TokenIds: &pb.TokenIds{Ids: prompt}}
			req.RequestId = fmt.Sprintf("client-%d", i)
		}
		resp, err := h.client.Generate(ctxT(t), req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		esp := engineSampling(sp)
		want := expect(prompt, esp, tok.VocabSize())
		checkChoices(t, fmt.Sprintf("request %d", i), resp.Choices, want, esp)
		if u := resp.Usage; u == nil || int(u.PromptTokens) != len(prompt) || int(u.CompletionTokens) != totalTokens(want) || int(u.CachedTokens) != len(prompt)/2 {
			t.Errorf("request %d: usage %v, want %d prompt %d completion", i, u, len(prompt), totalTokens(want))
		}
		if req.RequestId != "" && resp.RequestId != req.RequestId {
			t.Errorf("request id %q, want %q", resp.RequestId, req.RequestId)
		}
		if req.RequestId == "" && !strings.HasPrefix(resp.RequestId, "grpc-") {
			t.Errorf("made request id %q", resp.RequestId)
		}
		// What reached the engine.
		seen := h.fake.requests()
		got := seen[len(seen)-1]
		if !slices.Equal(got.Prompt, prompt) || got.Priority != int(req.Priority) || got.Arrival.IsZero() ||
			!strings.HasPrefix(got.ID, resp.RequestId+"-") {
			t.Errorf("engine request %+v", got)
		}
		g, w := got.Sampling, esp
		if g.N != w.N || g.MaxTokens != w.MaxTokens || g.Temperature != w.Temperature || g.TopP != w.TopP ||
			g.TopK != w.TopK || g.MinP != w.MinP || *g.Seed != *w.Seed || g.RepetitionPenalty != 1 ||
			!slices.Equal(g.StopTokenIDs, w.StopTokenIDs) || g.Logprobs != w.Logprobs || g.TopLogprobs != w.TopLogprobs ||
			(g.Grammar != nil) != (sp.GetJsonObject() || sp.GetJsonSchema() != "" || sp.GetRegex() != "") || g.KeepSpecialTokens != sp.GetKeepSpecialTokens() {
			t.Errorf("request %d: engine sampling %+v, want %+v", i, g, w)
		}
	}
}

// predicting is r with a prediction.
func predicting(r *pb.GenerateRequest) *pb.GenerateRequest {
	r.Prediction = "the text the output should repeat"
	return r
}

// TestPrediction: a request's prediction reaches the engine as its
// tokens (no special tokens added), and the engine's counts of accepted
// and rejected prediction tokens come back in the usage.
func TestPrediction(t *testing.T) {
	tok := loadTok(t)
	h := start(t, newFake(4096, tok.VocabSize()), Options{})
	text := "func main() {\n\tfmt.Println(\"hello\")\n}\n"
	resp, err := h.client.Generate(ctxT(t), &pb.GenerateRequest{Prompt: &pb.GenerateRequest_TokenIds{TokenIds: &pb.TokenIds{Ids: []int32{5, 6}}},
		Prediction: text})
	if err != nil {
		t.Fatal(err)
	}
	want, err := tok.Encode(text, false)
	if err != nil {
		t.Fatal(err)
	}
	seen := h.fake.requests()
	if got := seen[len(seen)-1].Prediction; !slices.Equal(got, want) {
		t.Errorf("engine prediction %v, want %v", got, want)
	}
	if u := resp.Usage; u.AcceptedPredictionTokens != int32(len(want)) || u.RejectedPredictionTokens != 1 {
		t.Errorf("usage %v: want %d accepted (the fake's count), 1 rejected", u, len(want))
	}
}

func TestDefaults(t *testing.T) {
	tok := loadTok(t)
	fake := newFake(40, tok.VocabSize())
	for _, c := range []struct {
		name      string
		opts      Options
		sampling  *pb.SamplingParams
		addSpec   *bool
		maxTokens int
	}{
		{"context left", Options{}, nil, nil, 40 - 3},
		{"server default", Options{DefaultMaxTokens: 5}, nil, nil, 5},
		{"server default capped by context", Options{DefaultMaxTokens: 500}, &pb.SamplingParams{TopK: ptr(int32(-1))}, ptr(false), 40 - 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := start(t, fake, c.opts)
			resp, err := h.client.Generate(ctxT(t), &pb.GenerateRequest{
				Prompt: &pb.GenerateRequest_TokenIds{TokenIds: &pb.TokenIds{Ids: []int32{5, 6, 7}}}, Sampling: c.sampling, AddSpecialTokens: c.addSpec,
			})
			if err != nil {
				t.Fatal(err)
			}
			seen := fake.requests()
			got := seen[len(seen)-1].Sampling
			want := engine.SamplingParams{N: 1, MaxTokens: c.maxTokens, Temperature: 1, TopP: 1, RepetitionPenalty: 1}
			if got.N != want.N || got.MaxTokens != want.MaxTokens || got.Temperature != 1 || got.TopP != 1 || got.TopK != 0 ||
				got.MinP != 0 || got.Seed != nil || got.RepetitionPenalty != 1 || got.PresencePenalty != 0 || got.Logprobs || len(got.Stop) != 0 {
				t.Errorf("engine sampling %+v, want %+v", got, want)
			}
			if got.Grammar != nil {
				t.Error("json_object defaulted to on")
			}
			if n := len(resp.Choices[0].TokenIds); n != c.maxTokens {
				t.Errorf("%d tokens, want %d", n, c.maxTokens)
			}
		})
	}
}

func TestStopToken(t *testing.T) {
	tok := loadTok(t)
	h := start(t, newFake(4096, tok.VocabSize()), Options{})
	prompt := []int32{11, 22, 33}
	stop := fakeToken(prompt, 0, 3, tok.VocabSize()) // choice 0's 4th token
	resp, err := h.client.Generate(ctxT(t), &pb.GenerateRequest{
		Prompt:   &pb.GenerateRequest_TokenIds{TokenIds: &pb.TokenIds{Ids: prompt}},
		Sampling: &pb.SamplingParams{MaxTokens: ptr(int32(10)), StopTokenIds: []int32{stop}},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := resp.Choices[0]
	if c.FinishReason != engine.FinishStop || len(c.TokenIds) > 4 || c.TokenIds[len(c.TokenIds)-1] != stop {
		t.Errorf("choice %v: want finish stop at token %d", c, stop)
	}
}

func TestGenerateStream(t *testing.T) {
	r := newRand(t)
	tok := loadTok(t)
	h := start(t, newFake(4096, tok.VocabSize()), Options{})
	for i := range 6 {
		text := randText(r)
		sp := randSampling(r, tok.VocabSize())
		prompt, _ := tok.Encode(text, true)
		stream, err := h.client.GenerateStream(ctxT(t), &pb.GenerateRequest{
			Prompt: &pb.GenerateRequest_Text{Text: text}, Sampling: sp, RequestId: fmt.Sprintf("s%d", i),
		})
		if err != nil {
			t.Fatal(err)
		}
		esp := engineSampling(sp)
		want := expect(prompt, esp, tok.VocabSize())
		got := make([]*pb.Choice, esp.N)
		for j := range got {
			got[j] = &pb.Choice{Index: int32(j)}
		}
		var msgs []*pb.GenerateStreamResponse
		for {
			m, err := stream.Recv()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			msgs = append(msgs, m)
			if m.RequestId != fmt.Sprintf("s%d", i) {
				t.Errorf("message for request %q", m.RequestId)
			}
			c := got[m.Index]
			if c.FinishReason != "" {
				t.Errorf("choice %d: message after its finish", m.Index)
			}
			if len(m.TokenIds) != 1 {
				t.Errorf("message with %d tokens, want one per engine event", len(m.TokenIds))
			}
			c.TokenIds = append(c.TokenIds, m.TokenIds...)
			c.Text += m.Text
			c.Logprobs = append(c.Logprobs, m.Logprobs...)
			c.FinishReason = m.FinishReason
		}
		if len(msgs) != totalTokens(want) {
			t.Errorf("%d messages, want one per token: %d", len(msgs), totalTokens(want))
		}
		checkChoices(t, fmt.Sprintf("stream %d", i), got, want, esp)
		for j, m := range msgs {
			if (m.Usage != nil) != (j == len(msgs)-1) {
				t.Errorf("message %d of %d has usage %v", j, len(msgs), m.Usage)
			}
		}
		if u := msgs[len(msgs)-1].Usage; int(u.CompletionTokens) != totalTokens(want) || int(u.PromptTokens) != len(prompt) {
			t.Errorf("final usage %v", u)
		}
	}
}

func TestBatchGenerate(t *testing.T) {
	r := newRand(t)
	tok := loadTok(t)
	fake := newFake(4096, tok.VocabSize())
	fake.delay = 5 * time.Millisecond
	fake.errs = map[string]error{"full": engine.ErrQueueFull}
	h := start(t, fake, Options{})
	// Lengths chosen so completion order differs from request order by
	// tens of milliseconds: 2 (5 ms) < 3 (60 ms) < 0 (150 ms); 1 fails at once.
	lengths := []int32{30, 0, 1, 12}
	shared := &pb.SamplingParams{MaxTokens: ptr(int32(12)), Logprobs: true, TopLogprobs: ptr(int32(2))}
	req := &pb.BatchGenerateRequest{Sampling: shared}
	prompts := make([][]int32, len(lengths))
	for i, n := range lengths {
		text := randText(r)
		prompts[i], _ = tok.Encode(text, true)
		g := &pb.GenerateRequest{Prompt: &pb.GenerateRequest_Text{Text: text}}
		switch {
		case n == 0:
			g.RequestId = "full-please"
		case n != 12: // index 3 uses the shared settings
			g.Sampling = &pb.SamplingParams{MaxTokens: ptr(n), N: ptr(int32(2))}
		}
		req.Requests = append(req.Requests, g)
	}
	stream, err := h.client.BatchGenerate(ctxT(t), req)
	if err != nil {
		t.Fatal(err)
	}
	var order []int32
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		order = append(order, m.Index)
		i := m.Index
		if lengths[i] == 0 {
			if e := m.GetError(); e == nil || codes.Code(e.Code) != codes.ResourceExhausted || !strings.Contains(e.Message, "too many waiting") {
				t.Errorf("index %d: %v, want a ResourceExhausted error", i, m)
			}
			continue
		}
		resp := m.GetResponse()
		if resp == nil {
			t.Fatalf("index %d: %v", i, m)
		}
		own := req.Requests[i].Sampling
		if own == nil {
			own = shared
		}
		sp := engineSampling(own)
		checkChoices(t, fmt.Sprintf("batch index %d", i), resp.Choices, expect(prompts[i], sp, tok.VocabSize()), sp)
	}
	// The failure comes first, then completion order by length.
	if !slices.Equal(order, []int32{1, 2, 3, 0}) {
		t.Errorf("results arrived in order %v, want [1 2 3 0]", order)
	}
}

func TestBatchParallelLimit(t *testing.T) {
	tok := loadTok(t)
	fake := newFake(4096, tok.VocabSize())
	fake.delay = time.Millisecond
	h := start(t, fake, Options{BatchParallel: 2})
	var req pb.BatchGenerateRequest
	for i := range 9 {
		req.Requests = append(req.Requests, &pb.GenerateRequest{
			Prompt:   &pb.GenerateRequest_TokenIds{TokenIds: &pb.TokenIds{Ids: []int32{int32(i + 1)}}},
			Sampling: &pb.SamplingParams{MaxTokens: ptr(int32(3))},
		})
	}
	stream, err := h.client.BatchGenerate(ctxT(t), &req)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int32]bool{}
	for {
		m, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if seen[m.Index] || m.GetResponse() == nil {
			t.Errorf("index %d twice or failed: %v", m.Index, m)
		}
		seen[m.Index] = true
	}
	if len(seen) != 9 {
		t.Errorf("%d results, want 9", len(seen))
	}
}

func TestHealth(t *testing.T) {
	h := start(t, newFake(64, 100), Options{})
	hc := healthpb.NewHealthClient(h.conn)
	check := func(want healthpb.HealthCheckResponse_ServingStatus) {
		t.Helper()
		for _, svc := range []string{"", "mkserve.v1.Inference"} {
			resp, err := hc.Check(ctxT(t), &healthpb.HealthCheckRequest{Service: svc})
			if err != nil {
				t.Fatal(err)
			}
			if resp.Status != want {
				t.Errorf("service %q: %v, want %v", svc, resp.Status, want)
			}
		}
	}
	check(healthpb.HealthCheckResponse_NOT_SERVING)
	h.srv.SetServing(true)
	check(healthpb.HealthCheckResponse_SERVING)
	h.srv.SetServing(false)
	check(healthpb.HealthCheckResponse_NOT_SERVING)
	if _, err := hc.Check(ctxT(t), &healthpb.HealthCheckRequest{Service: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("unknown service: %v, want NotFound", err)
	}
}

func TestReflection(t *testing.T) {
	h := start(t, newFake(64, 100), Options{})
	rc := reflectionpb.NewServerReflectionClient(h.conn)
	stream, err := rc.ServerReflectionInfo(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{},
	}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	for _, want := range []string{"mkserve.v1.Inference", "grpc.health.v1.Health"} {
		if !slices.Contains(names, want) {
			t.Errorf("reflection lists %v, missing %s", names, want)
		}
	}
	// The service's descriptor resolves too (what grpcurl describe needs).
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{
		MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: "mkserve.v1.Inference"},
	}); err != nil {
		t.Fatal(err)
	}
	resp, err = stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if fds := resp.GetFileDescriptorResponse().GetFileDescriptorProto(); len(fds) == 0 {
		t.Errorf("no descriptor for mkserve.v1.Inference: %v", resp)
	}
}

// rpcCode is the code the server recorded for method (one call expected).
func rpcCodes(t *testing.T, reg *prometheus.Registry, method string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "mkserve:grpc_server_handled_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var meth, code string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "grpc_method":
					meth = l.GetValue()
				case "grpc_code":
					code = l.GetValue()
				}
			}
			if meth == method {
				out[code] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

func TestErrorCodes(t *testing.T) {
	tok := loadTok(t)
	vocab := tok.VocabSize()
	tokens := func(ids ...int32) *pb.GenerateRequest {
		return &pb.GenerateRequest{Prompt: &pb.GenerateRequest_TokenIds{TokenIds: &pb.TokenIds{Ids: ids}}}
	}
	with := func(sp *pb.SamplingParams) *pb.GenerateRequest {
		r := tokens(1, 2, 3)
		r.Sampling = sp
		return r
	}
	withID := func(id string) *pb.GenerateRequest {
		r := tokens(1, 2, 3)
		r.RequestId = id
		return r
	}
	for _, c := range []struct {
		req   *pb.GenerateRequest
		code  codes.Code
		field string // for InvalidArgument from validation
		text  string // in the message
	}{
		{&pb.GenerateRequest{}, codes.InvalidArgument, "prompt", "missing"},
		{&pb.GenerateRequest{Prompt: &pb.GenerateRequest_Text{}}, codes.InvalidArgument, "text", "empty"},
		{tokens(), codes.InvalidArgument, "token_ids.ids", "empty"},
		{tokens(1, int32(vocab)), codes.InvalidArgument, "token_ids.ids[1]", "not a token id"},
		{tokens(-4), codes.InvalidArgument, "token_ids.ids[0]", "not a token id"},
		{with(&pb.SamplingParams{N: ptr(int32(0))}), codes.InvalidArgument, "sampling.n", "[1, 128]"},
		{with(&pb.SamplingParams{N: ptr(int32(129))}), codes.InvalidArgument, "sampling.n", ""},
		{with(&pb.SamplingParams{MaxTokens: ptr(int32(0))}), codes.InvalidArgument, "sampling.max_tokens", ""},
		{with(&pb.SamplingParams{Temperature: ptr(float32(2.01))}), codes.InvalidArgument, "sampling.temperature", "[0, 2]"},
		{with(&pb.SamplingParams{Temperature: ptr(float32(-0.1))}), codes.InvalidArgument, "sampling.temperature", ""},
		{with(&pb.SamplingParams{TopP: ptr(float32(0))}), codes.InvalidArgument, "sampling.top_p", "(0, 1]"},
		{with(&pb.SamplingParams{TopK: ptr(int32(-2))}), codes.InvalidArgument, "sampling.top_k", ""},
		{with(&pb.SamplingParams{MinP: ptr(float32(1.5))}), codes.InvalidArgument, "sampling.min_p", ""},
		{with(&pb.SamplingParams{PresencePenalty: ptr(float32(2.5))}), codes.InvalidArgument, "sampling.presence_penalty", ""},
		{predicting(with(&pb.SamplingParams{PresencePenalty: ptr(float32(0.5))})), codes.InvalidArgument, "prediction", "presence_penalty"},
		{predicting(with(&pb.SamplingParams{RepetitionPenalty: ptr(float32(1.2))})), codes.InvalidArgument, "prediction", "repetition_penalty"},
		{with(&pb.SamplingParams{FrequencyPenalty: ptr(float32(-2.5))}), codes.InvalidArgument, "sampling.frequency_penalty", ""},
		{with(&pb.SamplingParams{RepetitionPenalty: ptr(float32(0))}), codes.InvalidArgument, "sampling.repetition_penalty", ""},
		{with(&pb.SamplingParams{Stop: []string{"a", ""}}), codes.InvalidArgument, "sampling.stop[1]", "empty"},
		{with(&pb.SamplingParams{StopTokenIds: []int32{int32(vocab + 5)}}), codes.InvalidArgument, "sampling.stop_token_ids[0]", ""},
		{with(&pb.SamplingParams{TopLogprobs: ptr(int32(3))}), codes.InvalidArgument, "sampling.top_logprobs", "needs logprobs"},
		{with(&pb.SamplingParams{TopLogprobs: ptr(int32(21)), Logprobs: true}), codes.InvalidArgument, "sampling.top_logprobs", ""},
		{with(&pb.SamplingParams{JsonObject: true, IgnoreEos: true}), codes.InvalidArgument, "sampling.json_object", "ignore_eos"},
		{with(&pb.SamplingParams{JsonSchema: `{"type": "object", "properties": {"a": {"type": "string", "pattern": "(a"}}}`}), codes.InvalidArgument,
			"sampling.json_schema", "pattern"},
		{with(&pb.SamplingParams{Regex: "("}), codes.InvalidArgument, "sampling.regex", "missing"},
		{with(&pb.SamplingParams{Regex: "a+", JsonObject: true}), codes.InvalidArgument, "sampling.regex", "json_object"},
		{with(&pb.SamplingParams{Grammar: "root ::= x"}), codes.InvalidArgument, "sampling.grammar", "never defined"},
		{with(&pb.SamplingParams{Grammar: `root ::= "a"`, Regex: "a"}), codes.InvalidArgument, "sampling.grammar", "regex"},
		{with(&pb.SamplingParams{JsonSchema: `{"type":`}), codes.InvalidArgument, "sampling.json_schema", "schema"},
		{with(&pb.SamplingParams{MaxTokens: ptr(int32(2)), MinTokens: 3}), codes.InvalidArgument, "sampling.min_tokens", "max_tokens"},
		{with(&pb.SamplingParams{MinTokens: -1}), codes.InvalidArgument, "sampling.min_tokens", ""},
		{withID("has space"), codes.InvalidArgument, "request_id", "printable"},
		// Too long: checked here, and by the engine for what slips by.
		{with(&pb.SamplingParams{MaxTokens: ptr(int32(62))}), codes.InvalidArgument, "", "exceeds the model's context"},
		{tokens(make([]int32, 64)...), codes.InvalidArgument, "", "fill the 64-token context"},
		// Engine errors.
		{withID("full"), codes.ResourceExhausted, "", "too many waiting"},
		{withID("drain"), codes.Unavailable, "", "shutting down"},
		{withID("toolong"), codes.InvalidArgument, "", "exceeds"},
		{withID("boom"), codes.Internal, "", "kaboom"},
		{withID("midfail"), codes.Internal, "", "device lost"},
	} {
		name := c.field
		if name == "" {
			name = c.text
		}
		t.Run(name, func(t *testing.T) {
			fake := newFake(64, vocab)
			fake.errs = map[string]error{
				"full": engine.ErrQueueFull, "drain": engine.ErrDraining,
				"toolong": fmt.Errorf("engine: %w", engine.ErrTooLong), "boom": errors.New("engine: kaboom"),
			}
			h := start(t, fake, Options{})
			check := func(rpc string, err error) {
				t.Helper()
				st := status.Convert(err)
				if st.Code() != c.code || !strings.Contains(st.Message(), c.text) {
					t.Errorf("%s: %v, want %v with %q", rpc, err, c.code, c.text)
				}
				if c.field != "" {
					if !strings.HasPrefix(st.Message(), c.field+": ") {
						t.Errorf("%s: message %q does not start with the field %q", rpc, st.Message(), c.field)
					}
					var br *errdetails.BadRequest
					for _, d := range st.Details() {
						if b, ok := d.(*errdetails.BadRequest); ok {
							br = b
						}
					}
					if br == nil || len(br.FieldViolations) != 1 || br.FieldViolations[0].Field != c.field {
						t.Errorf("%s: BadRequest detail %v, want field %q", rpc, br, c.field)
					}
				}
			}
			_, err := h.client.Generate(ctxT(t), c.req)
			check("Generate", err)
			stream, err := h.client.GenerateStream(ctxT(t), c.req)
			if err == nil {
				for err == nil {
					_, err = stream.Recv()
				}
			}
			check("GenerateStream", err)
			if got := rpcCodes(t, h.reg, "/mkserve.v1.Inference/Generate"); got[c.code.String()] != 1 {
				t.Errorf("server recorded %v for Generate, want one %v", got, c.code)
			}

			// In a batch: validation fails the call naming the request;
			// engine errors fail only their request.
			batch, err := h.client.BatchGenerate(ctxT(t), &pb.BatchGenerateRequest{Requests: []*pb.GenerateRequest{tokens(7), c.req}})
			if err != nil {
				t.Fatal(err)
			}
			var msgs []*pb.BatchGenerateResponse
			for {
				m, err2 := batch.Recv()
				if err2 != nil {
					err = err2
					break
				}
				msgs = append(msgs, m)
			}
			if c.field != "" || c.code == codes.InvalidArgument && !strings.HasPrefix(c.req.RequestId, "toolong") {
				st := status.Convert(err)
				if st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), "requests[1]") {
					t.Errorf("batch: %v, want InvalidArgument for requests[1]", err)
				}
				return
			}
			if err != io.EOF || len(msgs) != 2 {
				t.Fatalf("batch: %v after %d messages", err, len(msgs))
			}
			for _, m := range msgs {
				switch m.Index {
				case 0:
					if m.GetResponse() == nil {
						t.Errorf("batch: good request failed: %v", m)
					}
				case 1:
					if e := m.GetError(); e == nil || codes.Code(e.Code) != c.code || !strings.Contains(e.Message, c.text) {
						t.Errorf("batch: %v, want %v error", m, c.code)
					}
				}
			}
		})
	}
}

func TestCode(t *testing.T) {
	for _, c := range []struct {
		err  error
		code codes.Code
	}{
		{nil, codes.OK},
		{&FieldError{"n", "bad"}, codes.InvalidArgument},
		{fmt.Errorf("requests[2]: %w", &FieldError{"n", "bad"}), codes.InvalidArgument},
		{engine.ErrTooLong, codes.InvalidArgument},
		{fmt.Errorf("%w: no bytes", engine.ErrGrammarUnsupported), codes.InvalidArgument},
		{fmt.Errorf("x: %w", engine.ErrQueueFull), codes.ResourceExhausted},
		{engine.ErrDraining, codes.Unavailable},
		{context.Canceled, codes.Canceled},
		{fmt.Errorf("step: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{errors.New("other"), codes.Internal},
		{status.Error(codes.Aborted, "kept"), codes.Aborted},
	} {
		if got := Code(c.err); got != c.code {
			t.Errorf("Code(%v) = %v, want %v", c.err, got, c.code)
		}
		if got := status.Code(ToStatus(c.err)); got != c.code {
			t.Errorf("ToStatus(%v) code %v, want %v", c.err, got, c.code)
		}
	}
}

// waitFor waits for id on c.
func waitFor(t *testing.T, c <-chan string, prefix, what string) string {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case id := <-c:
			if strings.HasPrefix(id, prefix) {
				return id
			}
		case <-timeout:
			t.Fatalf("no %s for %s within 10 s", what, prefix)
		}
	}
}

func TestCancelPropagates(t *testing.T) {
	tok := loadTok(t)
	long := &pb.SamplingParams{MaxTokens: ptr(int32(2000))}
	for _, rpc := range []string{"Generate", "GenerateStream", "BatchGenerate"} {
		t.Run(rpc, func(t *testing.T) {
			fake := newFake(4096, tok.VocabSize())
			fake.delay = 2 * time.Millisecond // 2000 tokens: 4 s unless cancelled
			h := start(t, fake, Options{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			req := &pb.GenerateRequest{Prompt: &pb.GenerateRequest_Text{Text: "cancel me"}, Sampling: long, RequestId: "c-" + rpc}
			errc := make(chan error, 1)
			go func() {
				var err error
				switch rpc {
				case "Generate":
					_, err = h.client.Generate(ctx, req)
				case "GenerateStream":
					var s grpc.ServerStreamingClient[pb.GenerateStreamResponse]
					if s, err = h.client.GenerateStream(ctx, req); err == nil {
						for err == nil {
							_, err = s.Recv()
						}
					}
				case "BatchGenerate":
					var s grpc.ServerStreamingClient[pb.BatchGenerateResponse]
					if s, err = h.client.BatchGenerate(ctx, &pb.BatchGenerateRequest{Requests: []*pb.GenerateRequest{req, req}}); err == nil {
						for err == nil {
							_, err = s.Recv()
						}
					}
				}
				errc <- err
			}()
			started := time.Now()
			id := waitFor(t, fake.started, "c-", "engine start")
			if rpc == "BatchGenerate" {
				// Both requests running first: a batch cancelled before its
				// second request reached the engine never starts it (the
				// launcher stops at the cancelled context), and there would
				// be no second cancellation to see.
				waitFor(t, fake.started, "c-", "second engine start")
			}
			cancel()
			if got := waitFor(t, fake.cancelled, "c-", "engine cancellation"); got != id && rpc != "BatchGenerate" {
				t.Errorf("cancelled %s, want %s", got, id)
			}
			if rpc == "BatchGenerate" {
				waitFor(t, fake.cancelled, "c-", "second engine cancellation")
			}
			if d := time.Since(started); d > 3*time.Second {
				t.Errorf("cancellation took %v", d)
			}
			if err := <-errc; status.Code(err) != codes.Canceled {
				t.Errorf("client got %v, want Canceled", err)
			}
			// The server saw the cancellation as Canceled too.
			deadline := time.Now().Add(5 * time.Second)
			for rpcCodes(t, h.reg, "/mkserve.v1.Inference/"+rpc)["Canceled"] != 1 {
				if time.Now().After(deadline) {
					t.Fatalf("server recorded %v, want one Canceled", rpcCodes(t, h.reg, "/mkserve.v1.Inference/"+rpc))
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}

func TestDeadline(t *testing.T) {
	tok := loadTok(t)
	fake := newFake(4096, tok.VocabSize())
	fake.delay = 2 * time.Millisecond
	h := start(t, fake, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := h.client.Generate(ctx, &pb.GenerateRequest{
		Prompt: &pb.GenerateRequest_Text{Text: "slow"}, Sampling: &pb.SamplingParams{MaxTokens: ptr(int32(2000))},
	})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("client got %v, want DeadlineExceeded", err)
	}
	waitFor(t, fake.cancelled, "", "engine cancellation")
	// Over the network the server sees the client's deadline as either its
	// own timer or the client's cancellation, whichever comes first; in
	// process the handler's mapping is deterministic.
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	_, err = h.srv.Generate(ctx, &pb.GenerateRequest{
		Prompt: &pb.GenerateRequest_Text{Text: "slow"}, Sampling: &pb.SamplingParams{MaxTokens: ptr(int32(2000))},
	})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("handler returned %v, want DeadlineExceeded", err)
	}
	waitFor(t, fake.cancelled, "", "engine cancellation")
}

func TestInterceptors(t *testing.T) {
	tok := loadTok(t)
	h := start(t, newFake(4096, tok.VocabSize()), Options{})
	ok := &pb.GenerateRequest{Prompt: &pb.GenerateRequest_Text{Text: "hi"}, Sampling: &pb.SamplingParams{MaxTokens: ptr(int32(2))}}
	bad := &pb.GenerateRequest{}
	for range 3 {
		if _, err := h.client.Generate(ctxT(t), ok); err != nil {
			t.Fatal(err)
		}
	}
	_, _ = h.client.Generate(ctxT(t), bad)
	s, err := h.client.GenerateStream(ctxT(t), ok)
	if err != nil {
		t.Fatal(err)
	}
	for err == nil {
		_, err = s.Recv()
	}
	got := rpcCodes(t, h.reg, "/mkserve.v1.Inference/Generate")
	if got["OK"] != 3 || got["InvalidArgument"] != 1 || len(got) != 2 {
		t.Errorf("Generate counts %v, want 3 OK, 1 InvalidArgument", got)
	}
	if got := rpcCodes(t, h.reg, "/mkserve.v1.Inference/GenerateStream"); got["OK"] != 1 {
		t.Errorf("GenerateStream counts %v, want 1 OK", got)
	}
	if n := testutil.CollectAndCount(h.srv.rpc.latency); n != 2 {
		t.Errorf("%d latency series, want 2 (one per method)", n)
	}
	var entries []observer.LoggedEntry
	for _, e := range h.logs.FilterMessage("grpc call").All() {
		if e.ContextMap()["method"] == "/mkserve.v1.Inference/Generate" {
			entries = append(entries, e)
		}
	}
	if len(entries) != 4 {
		t.Fatalf("%d Generate log lines, want 4", len(entries))
	}
	last := entries[3]
	if last.Level != zapcore.InfoLevel || last.ContextMap()["code"] != "InvalidArgument" ||
		!strings.Contains(fmt.Sprint(last.ContextMap()["error"]), "prompt") || last.ContextMap()["peer"] == nil {
		t.Errorf("log line %v %v", last.Level, last.ContextMap())
	}
	// Two servers on one registry share the collectors.
	New(h.fake, nil, Options{Registerer: h.reg})
}

func TestConcurrentClients(t *testing.T) {
	r := newRand(t)
	tok := loadTok(t)
	h := start(t, newFake(4096, tok.VocabSize()), Options{})
	type job struct {
		text string
		sp   *pb.SamplingParams
	}
	jobs := make([]job, 24)
	for i := range jobs {
		jobs[i] = job{randText(r), randSampling(r, tok.VocabSize())}
	}
	var wg sync.WaitGroup
	for i, j := range jobs {
		wg.Go(func() {
			resp, err := h.client.Generate(ctxT(t), &pb.GenerateRequest{Prompt: &pb.GenerateRequest_Text{Text: j.text}, Sampling: j.sp})
			if err != nil {
				t.Errorf("job %d: %v", i, err)
				return
			}
			prompt, _ := tok.Encode(j.text, true)
			esp := engineSampling(j.sp)
			checkChoices(t, fmt.Sprintf("job %d", i), resp.Choices, expect(prompt, esp, tok.VocabSize()), esp)
		})
	}
	wg.Wait()
}

func TestNoTokenizer(t *testing.T) {
	s := New(newFake(64, 100), nil, Options{})
	_, err := s.Generate(context.Background(), &pb.GenerateRequest{Prompt: &pb.GenerateRequest_Text{Text: "hi"}})
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), "token_ids") {
		t.Errorf("%v, want InvalidArgument asking for token_ids", err)
	}
	resp, err := s.Generate(context.Background(), &pb.GenerateRequest{
		Prompt:   &pb.GenerateRequest_TokenIds{TokenIds: &pb.TokenIds{Ids: []int32{99, 1 << 20}}},
		Sampling: &pb.SamplingParams{MaxTokens: ptr(int32(2))},
	})
	if err != nil || len(resp.Choices[0].TokenIds) != 2 {
		t.Errorf("token ids without a tokenizer (any id ≥ 0): %v %v", resp, err)
	}
}

func TestChecks(t *testing.T) {
	for _, c := range []struct {
		err   error
		field string // "" : valid
	}{
		{CheckN(1), ""}, {CheckN(MaxN), ""}, {CheckN(0), "n"}, {CheckN(MaxN + 1), "n"},
		{CheckMaxTokens(1), ""}, {CheckMaxTokens(0), "max_tokens"},
		{CheckTemperature(0), ""}, {CheckTemperature(2), ""}, {CheckTemperature(float32(nan())), "temperature"},
		{CheckTopP(1), ""}, {CheckTopP(1e-9), ""}, {CheckTopP(0), "top_p"}, {CheckTopP(1.0001), "top_p"},
		{CheckTopK(0), ""}, {CheckTopK(-1), "top_k"},
		{CheckMinP(0), ""}, {CheckMinP(1), ""}, {CheckMinP(-0.01), "min_p"},
		{CheckPenalty("presence_penalty", -2), ""}, {CheckPenalty("frequency_penalty", float32(inf())), "frequency_penalty"},
		{CheckRepetitionPenalty(2), ""}, {CheckRepetitionPenalty(10), ""}, {CheckRepetitionPenalty(10.5), "repetition_penalty"}, {CheckRepetitionPenalty(1e-6), ""}, {CheckRepetitionPenalty(0), "repetition_penalty"},
		{CheckTopLogprobs(20, true), ""}, {CheckTopLogprobs(0, false), ""}, {CheckTopLogprobs(1, false), "top_logprobs"},
		{CheckStop(make([]string, MaxStop+1)), "stop"}, {CheckStop([]string{"\xff"}), "stop[0]"},
		{CheckStop([]string{strings.Repeat("x", MaxStopLen+1)}), "stop[0]"}, {CheckStop([]string{"ok", "</s>"}), ""},
		{CheckStopTokenIDs(make([]int32, MaxStopTokenIDs+1), 10), "stop_token_ids"},
		{CheckTokenIDs("ids", []int32{0, 9}, 10), ""}, {CheckTokenIDs("ids", []int32{0, 10}, 10), "ids[1]"},
		{CheckTokenIDs("ids", []int32{1 << 30}, 0), ""}, {CheckTokenIDs("ids", []int32{-1}, 0), "ids[0]"},
		{CheckRequestID("abc-123_X"), ""}, {CheckRequestID("tab\t"), "request_id"}, {CheckRequestID(strings.Repeat("a", MaxRequestIDLen+1)), "request_id"},
	} {
		var fe *FieldError
		switch {
		case c.field == "" && c.err != nil:
			t.Errorf("unexpected %v", c.err)
		case c.field != "" && (!errors.As(c.err, &fe) || fe.Field != c.field):
			t.Errorf("got %v, want an error for %s", c.err, c.field)
		}
	}
}

// TestProtoRoundTrip guards the optional-field semantics: an explicit 0
// is kept apart from unset on the wire.
func TestProtoRoundTrip(t *testing.T) {
	in := &pb.SamplingParams{Temperature: ptr(float32(0)), TopK: ptr(int32(0))}
	b, err := proto.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out pb.SamplingParams
	if err := proto.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if out.Temperature == nil || *out.Temperature != 0 || out.TopP != nil {
		t.Errorf("round trip %v", &out)
	}
	s := New(newFake(64, 100), nil, Options{})
	sp, err := s.sampling(&out, 3)
	if err != nil || sp.Temperature != 0 || sp.TopP != 1 {
		t.Errorf("explicit temperature 0 became %v (%v)", sp.Temperature, err)
	}
}

// TestHandlerPanic: a panic while serving a call (here in the generator)
// answers that call with Internal and leaves the server serving, for unary
// and streaming calls alike.
func TestHandlerPanic(t *testing.T) {
	tok := loadTok(t)
	h := start(t, newFake(4096, tok.VocabSize()), Options{})
	h.srv.SetServing(true)
	req := func(id string) *pb.GenerateRequest {
		return &pb.GenerateRequest{Prompt: &pb.GenerateRequest_TokenIds{TokenIds: &pb.TokenIds{Ids: []int32{1, 2, 3}}},
			RequestId: id}
	}
	if _, err := h.client.Generate(ctxT(t), req("panic-1")); status.Code(err) != codes.Internal {
		t.Errorf("unary call whose generator panics: %v, want Internal", err)
	}
	st, err := h.client.GenerateStream(ctxT(t), req("panic-2"))
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.Internal {
		t.Errorf("streaming call whose generator panics: %v, want Internal", err)
	}
	// In a batch, the panicking request fails alone.
	bs, err := h.client.BatchGenerate(ctxT(t), &pb.BatchGenerateRequest{Requests: []*pb.GenerateRequest{req("ok-1"), req("panic-3"), req("ok-2")}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[int32]bool{} // index → ok
	for {
		r, err := bs.Recv()
		if err != nil {
			break
		}
		got[r.Index] = r.GetResponse() != nil
		if e := r.GetError(); e != nil && codes.Code(e.Code) != codes.Internal {
			t.Errorf("batch item %d: error code %d, want Internal", r.Index, e.Code)
		}
	}
	if len(got) != 3 || !got[0] || got[1] || !got[2] {
		t.Errorf("batch results (index → ok): %v, want 0 and 2 ok, 1 failed", got)
	}
	if _, err := h.client.Generate(ctxT(t), req("fine")); err != nil {
		t.Errorf("the next call: %v", err)
	}
	if n := h.logs.FilterMessage("panic in a gRPC handler").Len(); n != 3 {
		t.Errorf("%d panics logged, want 3", n)
	}
}
