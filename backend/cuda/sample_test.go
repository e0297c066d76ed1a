package cuda_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/backend/cuda"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/kernels"
	"github.com/mkserve/mkserve/models"
)

// The reference is kernels.SampleHost (engine/sampler.go followed
// literally); TestSampleHostMatchesEngine checks it against the engine
// itself, through engine.New with a model whose logits are a fixed row.

var (
	sbOnce sync.Once
	sbBE   *cuda.Backend
	sbErr  error
)

// sampleBackend opens the GPU backend or skips (fails with MKSERVE_REQUIRE_GPU=1).
func sampleBackend(tb testing.TB) *cuda.Backend {
	tb.Helper()
	sbOnce.Do(func() { sbBE, sbErr = cuda.New(cuda.Options{}) })
	if sbErr != nil {
		if errors.Is(sbErr, kernels.ErrUnavailable) && os.Getenv("MKSERVE_REQUIRE_GPU") != "1" {
			tb.Skipf("no GPU here: %v", sbErr)
		}
		tb.Fatal(sbErr)
	}
	return sbBE
}

func seededRNG(tb testing.TB) *rand.Rand {
	seed := uint64(time.Now().UnixNano())
	tb.Logf("seed %d", seed)
	return rand.New(rand.NewPCG(seed, 7))
}

// rowLogits draws V logits of a kind (see kernels' sample tests).
func rowLogits(r *rand.Rand, V int, kind string) []float32 {
	v := make([]float32, V)
	for i := range v {
		v[i] = float32(r.NormFloat64() * 3)
	}
	switch kind {
	case "ties":
		for i := range v {
			v[i] = float32(math.Round(float64(v[i])*2) / 2)
		}
	case "dominant":
		v[r.IntN(V)] += 30
	case "neginf":
		for i := range v {
			if r.IntN(3) == 0 {
				v[i] = float32(math.Inf(-1))
			}
		}
		v[r.IntN(V)] = 1
	case "flat":
		for i := range v {
			v[i] = 0.5
		}
	case "narrow":
		for i := range v {
			v[i] *= 0.01 / 3
		}
	}
	return v
}

var rowKinds = []string{"normal", "ties", "dominant", "neginf", "flat", "narrow"}

// randParams draws engine sampling parameters (within engine.Validate's ranges).
func randParams(r *rand.Rand) engine.SamplingParams {
	pick := func(v ...float32) float32 { return v[r.IntN(len(v))] }
	p := engine.SamplingParams{
		N: 1, Temperature: pick(0, 0.3, 0.8, 1, 1.5), TopK: []int{0, 0, 1, 5, 50, 1000, 5000}[r.IntN(7)],
		TopP: pick(1, 1, 0.9, 0.5, 0.95), MinP: pick(0, 0, 0, 0.05, 0.2), RepetitionPenalty: 1,
		IgnoreEOS: true, Logprobs: true, TopLogprobs: []int{0, 1, 5, 20}[r.IntN(4)],
	}
	if r.IntN(2) == 0 {
		p.RepetitionPenalty = pick(1.1, 1.3, 0.8)
	}
	if r.IntN(2) == 0 {
		p.PresencePenalty = pick(0, 0.5, -0.5, 1.5)
		p.FrequencyPenalty = pick(0, 0.2, -0.3, 1)
	}
	seed := r.Uint64()
	p.Seed = &seed
	return p
}

// history is one sequence's state for the penalties, as the engine keeps it.
type history struct {
	p      *engine.SamplingParams
	rng    *rand.Rand
	seen   map[int32]bool
	counts map[int32]int32
	order  []int32 // output tokens in first-seen order
}

func newHistory(p *engine.SamplingParams, prompt []int32) *history {
	// The engine's stream for choice 0 (engine/sampler.go newSampler).
	h := &history{p: p, rng: rand.New(rand.NewPCG(*p.Seed, 0*0x9e3779b97f4a7c15+1)), seen: map[int32]bool{}, counts: map[int32]int32{}}
	for _, t := range prompt {
		h.seen[t] = true
	}
	return h
}

// row is the next step's SampleRow; it draws U from the engine's stream
// when the step will draw (temperature > 0 and some finite logit).
func (h *history) row(logits []float32) kernels.SampleRow {
	p := h.p
	r := kernels.SampleRow{Temperature: p.Temperature, TopK: p.TopK, TopP: p.TopP, MinP: p.MinP,
		RepetitionPenalty: p.RepetitionPenalty, PresencePenalty: p.PresencePenalty, FrequencyPenalty: p.FrequencyPenalty,
		TopLogprobs: p.TopLogprobs}
	if p.RepetitionPenalty != 1 {
		for t := range h.seen {
			r.Seen = append(r.Seen, t)
		}
	}
	for _, t := range h.order {
		r.Output = append(r.Output, t)
		r.Counts = append(r.Counts, h.counts[t])
	}
	if p.Temperature != 0 {
		finite := false
		for _, x := range logits { // the penalties never make a finite logit infinite here
			if x > float32(math.Inf(-1)) {
				finite = true
				break
			}
		}
		if finite {
			r.U = h.rng.Float64()
		}
	}
	return r
}

func (h *history) observe(t int32) {
	if h.counts[t] == 0 {
		h.order = append(h.order, t)
	}
	h.counts[t]++
	h.seen[t] = true
}

// ---- the engine with a fixed-logits model ----

type fixedModel struct {
	cfg    *models.Config
	logits []float32
}

func (m *fixedModel) Config() *models.Config      { return m.cfg }
func (m *fixedModel) KVFloatsPerToken() int       { return 8 }
func (m *fixedModel) KVWidths() []backend.KVWidth { return []backend.KVWidth{{K: 4, V: 4}} }
func (m *fixedModel) Forward(b *backend.Batch) (backend.Tensor, error) {
	out := make(hostTensor, 0, len(b.LogitRows)*len(m.logits))
	for range b.LogitRows {
		out = append(out, m.logits...)
	}
	return out, nil
}

type hostTensor []float32

func (hostTensor) Shape() []int { return nil }

type hostBackend struct{ backend.Backend }

func (hostBackend) InitKV(int, int) error             { return nil }
func (hostBackend) CopyBlocks([]int32, []int32)       {}
func (hostBackend) ToHost(t backend.Tensor) []float32 { return t.(hostTensor) }

type letters struct{}

func (letters) Decode(ids []int32, _ bool) (string, error) {
	var b strings.Builder
	for _, id := range ids {
		b.WriteByte('a' + byte(id%26))
	}
	return b.String(), nil
}

// engineGenerate runs one request through engine.New on the fixed logits.
func engineGenerate(tb testing.TB, logits []float32, p engine.SamplingParams, prompt []int32) ([]int32, []engine.Logprob) {
	tb.Helper()
	m := &fixedModel{cfg: &models.Config{VocabSize: len(logits), MaxPositions: 1 << 16}, logits: logits}
	e, err := engine.New(m, hostBackend{}, letters{}, engine.Config{MaxNumSeqs: 4, KVCacheBytes: 1 << 24, MaxQueue: 4},
		engine.Options{Name: "sample-test"})
	if err != nil {
		tb.Fatal(err)
	}
	defer e.Shutdown(context.Background())
	ch, err := e.Generate(context.Background(), &engine.Request{ID: "r", Prompt: prompt, Sampling: p})
	if err != nil {
		tb.Fatal(err)
	}
	var toks []int32
	var lps []engine.Logprob
	for ev := range ch {
		if ev.Err != nil {
			tb.Fatal(ev.Err)
		}
		toks = append(toks, ev.TokenIDs...)
		lps = append(lps, ev.Logprobs...)
	}
	return toks, lps
}

// sameLP compares log-probabilities to 1e-4 (NaN with NaN, ±Inf exactly).
func sameLP(a, b float32) bool {
	if math.IsNaN(float64(b)) {
		return math.IsNaN(float64(a))
	}
	if math.IsInf(float64(b), 0) {
		return a == b
	}
	return math.Abs(float64(a)-float64(b)) <= 1e-4
}

// compareOut checks got against want (the reference): tokens equal unless
// the reference's margin marks a rounding-level boundary (reported true).
func compareOut(tb testing.TB, name string, V int, got, want kernels.SampleOut, margin float64) (boundary bool) {
	tb.Helper()
	if got.Token < 0 || int(got.Token) >= V {
		tb.Errorf("%s: token %d outside [0, %d)", name, got.Token, V)
		return false
	}
	if got.Token != want.Token {
		if margin < 1e-6 {
			tb.Logf("%s: boundary case: token %d, reference %d (margin %.3g)", name, got.Token, want.Token, margin)
			return true
		}
		tb.Errorf("%s: token %d, want %d (reference margin %.3g)", name, got.Token, want.Token, margin)
		return false
	}
	if !sameLP(got.Logprob, want.Logprob) {
		tb.Errorf("%s: logprob %v, want %v", name, got.Logprob, want.Logprob)
	}
	if len(got.TopIDs) != len(want.TopIDs) || len(got.TopLogp) != len(want.TopIDs) {
		tb.Errorf("%s: %d alternatives, want %d", name, len(got.TopIDs), len(want.TopIDs))
		return false
	}
	for k := range want.TopIDs {
		if got.TopIDs[k] != want.TopIDs[k] || !sameLP(got.TopLogp[k], want.TopLogp[k]) {
			tb.Errorf("%s: alternative %d is %d (%v), want %d (%v)", name, k, got.TopIDs[k], got.TopLogp[k], want.TopIDs[k], want.TopLogp[k])
			return false
		}
	}
	return false
}

// engineCase is one request of the engine comparisons.
type engineCase struct {
	name   string
	logits []float32
	p      engine.SamplingParams
	prompt []int32
}

func engineCases(r *rand.Rand, n int) []engineCase {
	var cs []engineCase
	for i := 0; i < n; i++ {
		V := []int{7, 300, 5000, 32000}[r.IntN(4)]
		kind := rowKinds[r.IntN(len(rowKinds))]
		p := randParams(r)
		p.MaxTokens = 6
		prompt := make([]int32, 1+r.IntN(20))
		for k := range prompt {
			prompt[k] = int32(r.IntN(V))
		}
		cs = append(cs, engineCase{fmt.Sprintf("case%d_V%d_%s", i, V, kind), rowLogits(r, V, kind), p, prompt})
	}
	return cs
}

// TestSampleHostMatchesEngine checks the reference against the real
// engine (no GPU needed): six tokens per request, penalties evolving.
func TestSampleHostMatchesEngine(t *testing.T) {
	r := seededRNG(t)
	boundary, steps := 0, 0
	for _, c := range engineCases(r, 60) {
		toks, lps := engineGenerate(t, c.logits, c.p, c.prompt)
		if len(toks) != c.p.MaxTokens || len(lps) != len(toks) {
			t.Fatalf("%s: engine returned %d tokens, %d logprobs", c.name, len(toks), len(lps))
		}
		h := newHistory(&c.p, c.prompt)
		for s, et := range toks {
			row := h.row(c.logits)
			want, margin := kernels.SampleHost(c.logits, &row)
			eng := kernels.SampleOut{Token: et, Logprob: lps[s].Logprob}
			for _, a := range lps[s].Top {
				eng.TopIDs = append(eng.TopIDs, a.ID)
				eng.TopLogp = append(eng.TopLogp, a.Logprob)
			}
			steps++
			if compareOut(t, fmt.Sprintf("%s step %d", c.name, s), len(c.logits), want, eng, margin) {
				boundary++
				break // the histories diverge after a boundary case
			}
			h.observe(et)
		}
	}
	t.Logf("%d steps, %d boundary cases", steps, boundary)
}

// TestSampleMatchesEngine runs the same requests' steps on the GPU, all
// requests of a step in one Sample call, against the engine's tokens.
func TestSampleMatchesEngine(t *testing.T) {
	be := sampleBackend(t)
	r := seededRNG(t)
	cs := engineCases(r, 48)
	// group by vocabulary: one [B, V] logits tensor per group
	groups := map[int][]int{}
	for i, c := range cs {
		groups[len(c.logits)] = append(groups[len(c.logits)], i)
	}
	boundary, steps := 0, 0
	for V, idx := range groups {
		var flat []float32
		hs := make([]*history, len(idx))
		etoks := make([][]int32, len(idx))
		elps := make([][]engine.Logprob, len(idx))
		alive := make([]bool, len(idx))
		for k, i := range idx {
			flat = append(flat, cs[i].logits...)
			hs[k] = newHistory(&cs[i].p, cs[i].prompt)
			etoks[k], elps[k] = engineGenerate(t, cs[i].logits, cs[i].p, cs[i].prompt)
			alive[k] = true
		}
		lt := be.FromFloat32([]int{len(idx), V}, flat)
		for s := 0; s < 6; s++ {
			rows := make([]backend.SampleRow, len(idx))
			for k, i := range idx {
				rows[k] = backend.SampleRow(hs[k].row(cs[i].logits))
			}
			got := be.Sample(lt, rows)
			for k, i := range idx {
				if !alive[k] {
					continue
				}
				eng := kernels.SampleOut{Token: etoks[k][s], Logprob: elps[k][s].Logprob}
				for _, a := range elps[k][s].Top {
					eng.TopIDs = append(eng.TopIDs, a.ID)
					eng.TopLogp = append(eng.TopLogp, a.Logprob)
				}
				krow := kernels.SampleRow(rows[k])
				_, margin := kernels.SampleHost(cs[i].logits, &krow)
				steps++
				if compareOut(t, fmt.Sprintf("%s step %d", cs[i].name, s), V, kernels.SampleOut(got[k]), eng, margin) {
					boundary++
					alive[k] = false
					continue
				}
				hs[k].observe(etoks[k][s])
			}
		}
	}
	t.Logf("%d steps, %d boundary cases", steps, boundary)
}

// TestSampleRandom: random rows through Backend.Sample against the
// reference, B up to 64, V up to 151936.
func TestSampleRandom(t *testing.T) {
	be := sampleBackend(t)
	r := seededRNG(t)
	cases := []struct{ B, V int }{{1, 7}, {64, 7}, {33, 1000}, {64, 32000}, {4, 151936}, {1, 201088}}
	boundary, n := 0, 0
	for _, c := range cases {
		flat := make([]float32, 0, c.B*c.V)
		rows := make([]backend.SampleRow, c.B)
		for b := range rows {
			flat = append(flat, rowLogits(r, c.V, rowKinds[r.IntN(len(rowKinds))])...)
			p := randParams(r)
			h := newHistory(&p, []int32{int32(r.IntN(c.V)), int32(r.IntN(c.V))})
			for k := 0; k < r.IntN(40); k++ {
				h.observe(int32(r.IntN(c.V)))
			}
			rows[b] = backend.SampleRow(h.row(nil))
			rows[b].U = r.Float64()
		}
		got := be.Sample(be.FromFloat32([]int{c.B, c.V}, flat), rows)
		if len(got) != c.B {
			t.Fatalf("B%d V%d: %d results", c.B, c.V, len(got))
		}
		for b := range rows {
			krow := kernels.SampleRow(rows[b])
			want, margin := kernels.SampleHost(flat[b*c.V:(b+1)*c.V], &krow)
			n++
			if compareOut(t, fmt.Sprintf("B%d V%d row %d", c.B, c.V, b), c.V, kernels.SampleOut(got[b]), want, margin) {
				boundary++
			}
		}
	}
	t.Logf("%d rows, %d boundary cases", n, boundary)
}

// TestSamplePanics: programming errors panic naming the op.
func TestSamplePanics(t *testing.T) {
	be := sampleBackend(t)
	lt := be.FromFloat32([]int{2, 5}, []float32{1, 2, 3, 4, 5, 5, 4, 3, 2, 1})
	ok := backend.SampleRow{TopP: 1, RepetitionPenalty: 1}
	for name, rows := range map[string][]backend.SampleRow{
		"one row for two":  {ok},
		"top logprobs 21":  {ok, {TopP: 1, RepetitionPenalty: 1, TopLogprobs: 21}},
		"id outside vocab": {ok, {TopP: 1, RepetitionPenalty: 2, Seen: []int32{5}}},
	} {
		func() {
			defer func() {
				if p := recover(); p == nil || !strings.Contains(fmt.Sprint(p), "cuda.Sample") {
					t.Errorf("%s: panic %v, want one naming cuda.Sample", name, p)
				}
			}()
			be.Sample(lt, rows)
		}()
	}
	got := be.Sample(lt, []backend.SampleRow{ok, ok})
	if got[0].Token != 4 || got[1].Token != 0 {
		t.Errorf("greedy tokens %d %d, want 4 0", got[0].Token, got[1].Token)
	}
}

// TestSampleAsync: SampleAsync's picks, waited for later and with several
// samplings on their way at once, equal Sample's for the same rows (every
// parameter family, penalties included); a second Wait is an error, and
// bad rows are an error, not a panic.
func TestSampleAsync(t *testing.T) {
	be := sampleBackend(t)
	r := seededRNG(t)
	const V = 32000
	var pend []backend.Pending
	var want [][]backend.SampleResult
	for _, B := range []int{1, 7, 64} {
		flat := make([]float32, 0, B*V)
		rows := make([]backend.SampleRow, B)
		for b := range rows {
			flat = append(flat, rowLogits(r, V, rowKinds[r.IntN(len(rowKinds))])...)
			p := randParams(r)
			h := newHistory(&p, []int32{int32(r.IntN(V))})
			h.observe(int32(r.IntN(V)))
			rows[b] = backend.SampleRow(h.row(nil))
			rows[b].U = r.Float64()
		}
		lt := be.FromFloat32([]int{B, V}, flat)
		want = append(want, be.Sample(lt, rows))
		p, err := be.SampleAsync(lt, rows)
		if err != nil {
			t.Fatal(err)
		}
		pend = append(pend, p)
	}
	for i, p := range pend {
		got, err := p.Wait()
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(want[i]) {
			t.Errorf("sampling %d: async %v\nsync %v", i, got, want[i])
		}
		if _, err := p.Wait(); err == nil {
			t.Errorf("sampling %d: a second Wait succeeded", i)
		}
	}
	lt := be.FromFloat32([]int{2, 5}, []float32{1, 2, 3, 4, 5, 5, 4, 3, 2, 1})
	if _, err := be.SampleAsync(lt, []backend.SampleRow{{TopP: 1, RepetitionPenalty: 1}}); err == nil {
		t.Error("one row for two: no error")
	}
}

// TestSampleProcessed: rows with a mask (backend.SampleRow.Allowed: one
// token, a few, half) and a bias (some −Inf) beside rows without, by Sample
// and SampleAsync, equal the reference on the processed logits
// (kernels.ProcessHost, then SampleHost); the logits tensor itself is left
// as it was (sampling it again gives the same picks).
func TestSampleProcessed(t *testing.T) {
	be := sampleBackend(t)
	r := seededRNG(t)
	boundary, n := 0, 0
	for _, c := range []struct{ B, V int }{{1, 100}, {9, 4096}, {33, 50257}, {4, 151936}} {
		flat := make([]float32, 0, c.B*c.V)
		rows := make([]backend.SampleRow, c.B)
		for b := range rows {
			flat = append(flat, rowLogits(r, c.V, rowKinds[r.IntN(len(rowKinds))])...)
			p := randParams(r)
			h := newHistory(&p, []int32{int32(r.IntN(c.V))})
			rows[b] = backend.SampleRow(h.row(nil))
			rows[b].U = r.Float64()
			if b%3 == 2 {
				continue // unprocessed
			}
			if b%2 == 0 {
				m := make([]uint64, (c.V+63)/64)
				keep := []int{1, 1 + c.V/100, c.V / 2}[r.IntN(3)]
				for range keep {
					t := r.IntN(c.V)
					m[t>>6] |= 1 << (t & 63)
				}
				rows[b].Allowed = m
			}
			for _, id := range r.Perm(c.V)[:1+r.IntN(20)] {
				v := float32(r.NormFloat64() * 5)
				if r.IntN(4) == 0 && rows[b].Allowed == nil { // (a ban could empty a small mask)
					v = float32(math.Inf(-1))
				}
				rows[b].BiasIDs, rows[b].BiasVals = append(rows[b].BiasIDs, int32(id)), append(rows[b].BiasVals, v)
			}
		}
		lt := be.FromFloat32([]int{c.B, c.V}, flat)
		got := be.Sample(lt, rows)
		again := be.Sample(lt, rows)
		pd, err := be.SampleAsync(lt, rows)
		if err != nil {
			t.Fatal(err)
		}
		async, err := pd.Wait()
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(again) != fmt.Sprint(got) || fmt.Sprint(async) != fmt.Sprint(got) {
			t.Errorf("B%d V%d: sampled again %v / async %v, first %v", c.B, c.V, again, async, got)
		}
		for b := range rows {
			krow := kernels.SampleRow(rows[b])
			x := append([]float32(nil), flat[b*c.V:(b+1)*c.V]...)
			kernels.ProcessHost(x, &krow)
			want, margin := kernels.SampleHost(x, &krow)
			n++
			name := fmt.Sprintf("B%d V%d row %d", c.B, c.V, b)
			if compareOut(t, name, c.V, kernels.SampleOut(got[b]), want, margin) {
				boundary++
			}
			if tok := got[b].Token; rows[b].Allowed != nil && rows[b].Allowed[tok>>6]&(1<<(tok&63)) == 0 {
				t.Errorf("%s: token %d is outside the mask", name, tok)
			}
		}
	}
	t.Logf("%d rows, %d boundary cases", n, boundary)
}
