package dist

import (
	"context"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cpu"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/models"
	"github.com/mkserve/mkserve/tensor"
	"github.com/mkserve/mkserve/tokenizer"
	"github.com/mkserve/mkserve/transport"
)

func TestBatchRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(rand.Uint64(), 1))
	for range 200 {
		b := &backend.Batch{}
		for s := range 1 + r.IntN(5) {
			n := 1 + r.IntN(6)
			past := r.IntN(40)
			span := backend.SeqSpan{ID: r.Uint64(), Offset: len(b.Tokens), Len: n, Past: past, ContextParallel: r.IntN(3)}
			if r.IntN(3) > 0 {
				for range (past+n)/4 + 1 {
					span.Blocks = append(span.Blocks, int32(r.IntN(1000)))
				}
			}
			if s == 0 && r.IntN(4) == 0 {
				span.Blocks = []int32{} // empty, not nil
			}
			for j := range n {
				b.Tokens = append(b.Tokens, int32(r.IntN(50000)))
				b.Positions = append(b.Positions, int32(past+j))
			}
			b.Seqs = append(b.Seqs, span)
		}
		if r.IntN(2) == 0 {
			b.LogitRows = []int{len(b.Tokens) - 1}
		}
		msg := encodeBatch(b)
		if msg[0] != msgForward {
			t.Fatalf("kind %d", msg[0])
		}
		got, err := decodeBatch(unpack(pack(msg))[1:])
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, b) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, b)
		}
	}
}

// FuzzDecodeBatch: any bytes decode to a valid batch or an error; no panic.
func FuzzDecodeBatch(f *testing.F) {
	f.Add(encodeBatch(&backend.Batch{Tokens: []int32{1, 2}, Positions: []int32{0, 1},
		Seqs: []backend.SeqSpan{{ID: 3, Len: 2, Blocks: []int32{0}}}})[1:])
	f.Add([]byte{0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, p []byte) {
		b, err := decodeBatch(p)
		if err == nil && b.Validate() != nil {
			t.Fatalf("decoded an invalid batch: %v", b.Validate())
		}
		unpack(pack(p))
	})
}

// world joins R ranks over gRPC on loopback, as R processes would.
func world(t testing.TB, R int) []*transport.GRPCComm { return transport.LoopbackForTest(t, R) }

const testModel = "../models/testdata/golden/qwen3_moe"

// rankSetup is one process's replica: its backend (one rank of the
// expert-parallel world) and model.
func rankSetup(t *testing.T, comm transport.Comm) (*cpu.Backend, models.Model) {
	be := cpu.New(cpu.Options{EPComm: comm})
	l, err := models.Load(testModel, be, models.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return be, l.Model
}

type result struct {
	tokens map[int][]int32
	err    error
}

func generate(e *engine.Engine, prompt []int32, p engine.SamplingParams) result {
	ch, err := e.Generate(context.Background(), &engine.Request{Prompt: prompt, Sampling: p})
	if err != nil {
		return result{err: err}
	}
	res := result{tokens: map[int][]int32{}}
	for ev := range ch {
		if ev.Err != nil {
			res.err = ev.Err
		}
		res.tokens[ev.Index] = append(res.tokens[ev.Index], ev.TokenIDs...)
	}
	return res
}

// TestWorldServesLikeOneProcess: an engine on rank 0 of a 3-process world
// (each rank holding a third of every MoE layer's experts, the workers
// mirroring every step) gives the single-process engine's greedy and
// seeded outputs, n > 1 forks (CopyBlocks) included; Stop ends the workers.
func TestWorldServesLikeOneProcess(t *testing.T) {
	tok, err := tokenizer.LoadDir(testModel)
	if err != nil {
		t.Fatal(err)
	}
	cfg := engine.Config{BlockSize: 4, MaxNumBatchedTokens: 16}
	seed := uint64(5)
	reqs := []struct {
		prompt []int32
		p      engine.SamplingParams
	}{
		{[]int32{5, 9, 13, 17, 21, 25, 29, 33, 37}, engine.SamplingParams{N: 1, MaxTokens: 8, IgnoreEOS: true, TopP: 1, RepetitionPenalty: 1}},
		{[]int32{3, 4, 5}, engine.SamplingParams{N: 2, MaxTokens: 6, Temperature: 1, Seed: &seed, IgnoreEOS: true, TopP: 1, RepetitionPenalty: 1}},
	}
	// One process.
	be := cpu.New(cpu.Options{})
	l, err := models.Load(testModel, be, models.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(l.Model, be, tok, cfg, engine.Options{Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	var want []result
	for _, rq := range reqs {
		want = append(want, generate(e, rq.prompt, rq.p))
	}
	e.Shutdown(context.Background())

	// Three processes.
	const R = 3
	comms := world(t, R)
	workErr := make([]error, R)
	var wg sync.WaitGroup
	for r := 1; r < R; r++ {
		wbe, wm := rankSetup(t, comms[r])
		wg.Add(1)
		go func() {
			defer wg.Done()
			workErr[r] = Work(context.Background(), comms[r], wm, wbe)
		}()
	}
	lbe, lm := rankSetup(t, comms[0])
	leader, err := NewLeader(comms[0])
	if err != nil {
		t.Fatal(err)
	}
	de, err := engine.New(leader.Model(lm), leader.Backend(lbe), tok, cfg, engine.Options{Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	for i, rq := range reqs {
		got := generate(de, rq.prompt, rq.p)
		if got.err != nil {
			t.Fatalf("request %d: %v", i, got.err)
		}
		for c := range rq.p.N {
			if !slices.Equal(got.tokens[c], want[i].tokens[c]) || len(got.tokens[c]) != rq.p.MaxTokens {
				t.Errorf("request %d choice %d: world %v, one process %v", i, c, got.tokens[c], want[i].tokens[c])
			}
		}
	}
	de.Shutdown(context.Background())
	if err := leader.Stop(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for r := 1; r < R; r++ {
		if workErr[r] != nil {
			t.Errorf("worker %d: %v", r, workErr[r])
		}
	}
}

// TestWorkerFailure: when a worker goes away, the leader's next request
// fails with an error instead of hanging, and the engine keeps answering.
func TestWorkerFailure(t *testing.T) {
	tok, err := tokenizer.LoadDir(testModel)
	if err != nil {
		t.Fatal(err)
	}
	comms := world(t, 2)
	wbe, wm := rankSetup(t, comms[1])
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Work(ctx, comms[1], wm, wbe) }()
	lbe, lm := rankSetup(t, comms[0])
	leader, _ := NewLeader(comms[0])
	e, err := engine.New(leader.Model(lm), leader.Backend(lbe), tok, engine.Config{BlockSize: 4}, engine.Options{Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown(context.Background())
	p := engine.SamplingParams{N: 1, MaxTokens: 3, IgnoreEOS: true, TopP: 1, RepetitionPenalty: 1}
	if r := generate(e, []int32{1, 2, 3}, p); r.err != nil {
		t.Fatalf("before the failure: %v", r.err)
	}
	failed := make(chan error, 1)
	leader.OnFail(func(err error) { failed <- err })
	cancel()
	comms[1].Close()
	if err := <-done; err == nil {
		t.Error("the stopped worker returned no error")
	}
	start := time.Now()
	r := generate(e, []int32{1, 2, 3}, p)
	if r.err == nil {
		t.Errorf("a request after the worker went away succeeded: %v", r.tokens)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the failing request took %v", d)
	}
	t.Logf("request error: %v", r.err)
	select {
	case err := <-failed:
		if err == nil || leader.Err() == nil {
			t.Errorf("OnFail got %v, Err is %v", err, leader.Err())
		}
	case <-time.After(10 * time.Second):
		t.Error("OnFail was not called after the world broke")
	}
}

// stepRecorder is a CPU backend that is a backend.StepGrapher: GraphStep
// counts the steps and runs f (as a backend without graphs would).
type stepRecorder struct {
	*cpu.Backend
	steps int
}

func (s *stepRecorder) GraphStep(b *backend.Batch, f func() (backend.Tensor, error)) (backend.Tensor, error) {
	s.steps++
	return f()
}

// forwardCounter counts a model's Forward calls.
type forwardCounter struct {
	models.Model
	n int
}

func (m *forwardCounter) Forward(b *backend.Batch) (backend.Tensor, error) {
	m.n++
	return m.Model.Forward(b)
}

// TestGraphStepBroadcastsOnce: with a StepGrapher backend the leader
// broadcasts each step once, before its GraphStep (the model's Forward
// inside it does not broadcast again), and the worker runs each step
// through its own GraphStep, with the leader's logits those of one process.
func TestGraphStepBroadcastsOnce(t *testing.T) {
	comms := world(t, 2)
	load := func(be backend.Backend) models.Model {
		l, err := models.Load(testModel, be, models.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l.Model
	}
	wbe := &stepRecorder{Backend: cpu.New(cpu.Options{EPComm: comms[1]})}
	wm := &forwardCounter{Model: load(wbe.Backend)}
	workErr := make(chan error, 1)
	go func() { workErr <- Work(context.Background(), comms[1], wm, wbe) }()

	lbe := &stepRecorder{Backend: cpu.New(cpu.Options{EPComm: comms[0]})}
	leader, err := NewLeader(comms[0])
	if err != nil {
		t.Fatal(err)
	}
	lb, lm := leader.Backend(lbe), leader.Model(&forwardCounter{Model: load(lbe.Backend)})
	if _, ok := lb.(backend.GraphWarmer); !ok {
		t.Fatal("the leader's backend hides GraphStep")
	}
	one := cpu.New(cpu.Options{})
	om := load(one)
	for _, be := range []backend.Backend{lb, one} {
		if err := be.InitKV(4, 16); err != nil {
			t.Fatal(err)
		}
	}
	steps := []*backend.Batch{backend.SingleSequence(1, []int32{5, 9, 13, 17, 21}, 0, false),
		backend.SingleSequence(1, []int32{25}, 5, false), backend.SingleSequence(1, []int32{29}, 6, false)}
	for i, b := range steps {
		b.Seqs[0].Blocks = []int32{0, 1}
		got, err := backend.RunStep(lb, b, func() (backend.Tensor, error) { return lm.Forward(b) })
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		want, err := om.Forward(b)
		if err != nil {
			t.Fatal(err)
		}
		// The experts' outputs are summed per rank, then over ranks: the
		// same terms in another order, so equal within float32 rounding.
		g, w := lbe.ToHost(got), one.ToHost(want)
		var d2, w2 float64
		for j := range w {
			d := float64(g[j] - w[j])
			d2, w2 = d2+d*d, w2+float64(w[j])*float64(w[j])
		}
		if len(g) != len(w) || len(w) == 0 || math.Sqrt(d2/w2) > 1e-5 {
			t.Errorf("step %d: the world's logits differ from one process's (relative L2 %.2g)", i, math.Sqrt(d2/w2))
		}
	}
	if err := leader.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := <-workErr; err != nil {
		t.Fatal(err)
	}
	if lbe.steps != 3 || wbe.steps != 3 || wm.n != 3 {
		t.Errorf("leader GraphSteps %d, worker GraphSteps %d, worker Forwards %d: want 3 each", lbe.steps, wbe.steps, wm.n)
	}
}

// deviceLike is a CPU backend that claims the optional interfaces of a GPU
// backend: it samples (greedy, on the host) and allocates its KV cache in
// one call, recording both.
type deviceLike struct {
	*cpu.Backend
	mu      sync.Mutex
	samples int
	widths  []backend.KVWidth
}

func (d *deviceLike) Sample(logits backend.Tensor, rows []backend.SampleRow) []backend.SampleResult {
	d.mu.Lock()
	d.samples++
	d.mu.Unlock()
	v, V := d.ToHost(logits), logits.Shape()[1]
	out := make([]backend.SampleResult, len(rows))
	for i := range rows {
		row := v[i*V : (i+1)*V]
		out[i].Token = int32(slices.Index(row, slices.Max(row)))
	}
	return out
}

func (d *deviceLike) KVElemBytes() int { return 2 }

func (d *deviceLike) AllocKV(w []backend.KVWidth) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.widths = append(d.widths, w...)
	return nil
}

// TestLeaderKeepsDeviceInterfaces: the leader's backend samples where the
// wrapped backend samples (on the leader only), allocates the KV cache on
// every rank through AllocKV with the wrapped backend's element size, and
// claims no Sampler where the wrapped backend has none. Until 2026-11-29
// the wrapper hid both: a world's engine copied the whole logits to the
// host each step and sized its KV cache for float32.
func TestLeaderKeepsDeviceInterfaces(t *testing.T) {
	comms := world(t, 2)
	wbe := &deviceLike{Backend: cpu.New(cpu.Options{EPComm: comms[1]})}
	workErr := make(chan error, 1)
	go func() { workErr <- Work(context.Background(), comms[1], nil, wbe) }()
	leader, err := NewLeader(comms[0])
	if err != nil {
		t.Fatal(err)
	}
	lbe := &deviceLike{Backend: cpu.New(cpu.Options{EPComm: comms[0]})}
	lb := leader.Backend(lbe)
	s, ok := lb.(backend.Sampler)
	if !ok {
		t.Fatal("the leader's backend hides the wrapped backend's Sample")
	}
	a, ok := lb.(backend.KVAllocator)
	if !ok {
		t.Fatal("the leader's backend is no KVAllocator")
	}
	if got := a.KVElemBytes(); got != 2 {
		t.Errorf("KVElemBytes %d, want the wrapped backend's 2", got)
	}
	if err := lb.InitKV(4, 8); err != nil {
		t.Fatal(err)
	}
	widths := []backend.KVWidth{{Layer: 0, K: 64, V: 64}, {Layer: 3, K: 576, V: 512}}
	if err := a.AllocKV(widths); err != nil {
		t.Fatal(err)
	}
	logits, err := lbe.Weight(tensor.FromFloat32("logits", []int{2, 3}, []float32{0.5, 2, -1, 7, 3, 1}))
	if err != nil {
		t.Fatal(err)
	}
	got := s.Sample(logits, make([]backend.SampleRow, 2))
	if len(got) != 2 || got[0].Token != 1 || got[1].Token != 0 {
		t.Errorf("Sample gave %+v, want tokens 1 and 0", got)
	}
	if err := leader.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := <-workErr; err != nil {
		t.Fatal(err)
	}
	for name, d := range map[string]*deviceLike{"leader": lbe, "worker": wbe} {
		if !reflect.DeepEqual(d.widths, widths) {
			t.Errorf("%s allocated %v, want %v", name, d.widths, widths)
		}
	}
	if lbe.samples != 1 || wbe.samples != 0 {
		t.Errorf("samples: leader %d, worker %d; want 1 and 0", lbe.samples, wbe.samples)
	}
	if _, ok := leader.Backend(cpu.New(cpu.Options{})).(backend.Sampler); ok {
		t.Error("the leader's backend claims Sample over a backend without it")
	}
}
