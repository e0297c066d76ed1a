package engine

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/models"
)

// TestSpecMeter: the meter compares a period of speculation with the
// latest pause at the same batch size, after 8, 16, 32 … steps: it pauses
// when speculation delivers fewer tokens a second, not when it delivers
// more, probes for a pause's rate when it has none or it is stale, does
// not count a period's first step, and doubles the pause after verdicts
// in a row.
func TestSpecMeter(t *testing.T) {
	type obs struct {
		on     bool
		tokens int
		ms     int
	}
	steps := func(n int, o obs) []obs {
		out := make([]obs, n)
		for i := range out {
			out[i] = o
		}
		return out
	}
	cat := func(parts ...[]obs) (out []obs) {
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	off := obs{false, 4, 1}  // 4 tokens a ms
	slow := obs{true, 8, 4}  // 2 tokens a ms
	fast := obs{true, 12, 2} // 6 tokens a ms
	for _, c := range []struct {
		name          string
		steps         []obs
		pause, pauses int
	}{
		{"too few steps on", cat(steps(specMeterMin+2, off), steps(5, slow)), 0, 0},
		{"no pause measured: probe", steps(1+specMeterMin, slow), specMeterMin + 2, 0},
		{"slower on", cat(steps(specMeterMin+2, off), steps(1+specMeterMin, slow)), specMeterPause, 1},
		{"faster on", cat(steps(specMeterMin+2, off), steps(40, fast)), 0, 0},
		{"first step of a period not counted", cat(steps(specMeterMin+2, off), []obs{{true, 1, 1000}}, steps(specMeterMin, fast)), 0, 0},
		{"slower only from the 16th", cat(steps(specMeterMin+2, off), steps(1+specMeterMin, fast), steps(specMeterMin, slow)), specMeterPause, 1},
		{"stale pause: probe", cat(steps(specMeterMin+2, off), steps(1+specMeterStale, fast)), specMeterMin + 2, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			var m specMeter
			for _, o := range c.steps {
				m.tick()
				m.observe(4, o.on, o.tokens, time.Duration(o.ms)*time.Millisecond)
			}
			if m.pause != c.pause || m.pauses != int64(c.pauses) {
				t.Errorf("pause %d, pauses %d; want %d, %d", m.pause, m.pauses, c.pause, c.pauses)
			}
		})
	}
	// Buckets: a pause measured at one batch size says nothing of another.
	var m specMeter
	for range specMeterMin + 2 {
		m.observe(4, false, 4, time.Millisecond)
	}
	for range 1 + specMeterMin {
		m.observe(32, true, 8, 100*time.Millisecond)
	}
	if m.pauses != 0 || m.pause != specMeterMin+2 {
		t.Errorf("another batch size: pause %d, pauses %d; want a probe", m.pause, m.pauses)
	}
	// Verdicts in a row double the pause; speculation measured faster ends
	// the streak.
	m = specMeter{}
	for i, want := range []int{specMeterPause, 2 * specMeterPause, 4 * specMeterPause} {
		for range specMeterMin + 2 {
			m.observe(4, false, 4, time.Millisecond)
		}
		for range 1 + specMeterMin {
			m.observe(4, true, 8, 4*time.Millisecond)
		}
		if m.pause != want {
			t.Errorf("verdict %d: pause %d, want %d", i+1, m.pause, want)
		}
	}
	for range specMeterMin + 2 {
		m.observe(4, false, 4, time.Millisecond)
	}
	for range 1 + specMeterMin {
		m.observe(4, true, 80, time.Millisecond)
	}
	if m.streak != 0 {
		t.Errorf("faster with speculation: streak %d, want 0", m.streak)
	}
}

// clockedEngine is an engine over m and be with speculation (spec tokens)
// whose clock reads now (ns), shut down with the test.
func clockedEngine(t *testing.T, m models.Model, be backend.Backend, spec int, now *atomic.Int64) *Engine {
	t.Helper()
	e, err := New(m, be, fakeDetok{}, Config{BlockSize: 4, KVCacheBytes: 1 << 20, SpeculativeTokens: spec},
		Options{Name: "t", Clock: func() time.Time { return time.Unix(0, now.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Shutdown(context.Background()) })
	return e
}

// greedyTokens sends every prompt through g (greedy, maxTokens, EOS
// ignored) and returns each one's tokens as text.
func greedyTokens(t *testing.T, e *Engine, g *gate, prompts [][]int32, maxTokens int) []string {
	t.Helper()
	chans := make([]<-chan Event, len(prompts))
	g.send(len(prompts), func(i int) {
		ch, err := e.Generate(context.Background(), &Request{Prompt: prompts[i],
			Sampling: SamplingParams{MaxTokens: maxTokens, TopP: 1, RepetitionPenalty: 1, IgnoreEOS: true}})
		if err != nil {
			t.Fatal(err)
		}
		chans[i] = ch
	})
	var out []string
	for _, toks := range tokensOf(t, chans) {
		out = append(out, fmt.Sprint(toks))
	}
	return out
}

// clockedModel is a rowModel whose forward passes advance a fake clock by
// cost(batch), held at its gate.
type clockedModel struct {
	*rowModel
	now  *atomic.Int64 // ns
	cost func(b *backend.Batch) time.Duration
	gate *gate
}

// gate holds an engine's first forward pass until a test has sent all of
// its requests, so that the steps — and the batch sizes the meter buckets
// them by — are the same however the test's goroutines are scheduled: the
// first request is prefilled alone, the rest are admitted together at the
// next step.
type gate struct {
	entered, open chan struct{}
	once          sync.Once
}

func newGate() *gate { return &gate{entered: make(chan struct{}), open: make(chan struct{})} }

// wait is a forward pass's: the first one signals it has begun and waits
// for the gate to open.
func (g *gate) wait() {
	g.once.Do(func() { close(g.entered) })
	<-g.open
}

// send sends request 0, waits for its forward pass to begin, sends
// requests 1 … n-1 and opens the gate.
func (g *gate) send(n int, send func(i int)) {
	send(0)
	<-g.entered
	for i := 1; i < n; i++ {
		send(i)
	}
	close(g.open)
}

func (m *clockedModel) Forward(b *backend.Batch) (backend.Tensor, error) {
	m.gate.wait()
	m.now.Add(int64(m.cost(b)))
	return m.rowModel.Forward(b)
}

// TestSpeculationMeteredEngine: on a model whose every draft is right, an
// engine whose verify steps cost more than the tokens they deliver pauses
// speculation (and drafts far less), while one whose verify steps cost
// what a decode step does keeps drafting; outputs are the same.
func TestSpeculationMeteredEngine(t *testing.T) {
	const V = 64
	cycle := func(t int32) int32 { return (t + 1) % 7 }
	run := func(perDraft time.Duration) ([]string, Stats, time.Duration) {
		var now atomic.Int64
		m := &clockedModel{rowModel: nextModel(V, cycle), now: &now, gate: newGate(), cost: func(b *backend.Batch) time.Duration {
			return time.Millisecond + perDraft*time.Duration(max(0, len(b.Tokens)-4)) // (4 sequences decode)
		}}
		e := clockedEngine(t, m, fakeBackend{}, 4, &now)
		var prompts [][]int32
		for i := range 4 {
			prompts = append(prompts, []int32{int32(i), int32(i + 1), 0, 1, 2, 3, 4, 5, 6})
		}
		out := greedyTokens(t, e, m.gate, prompts, 1000)
		return out, settled(t, e), time.Duration(now.Load())
	}
	cheapOut, cheap, _ := run(0)
	const perDraft = 5 * time.Millisecond
	dearOut, dear, took := run(perDraft)
	// Drafting at every step (as the cheap run does) would take each of
	// its steps at the dear price: 4 sequences of 4 draft tokens.
	always := time.Duration(cheap.Steps) * (time.Millisecond + 16*perDraft)
	t.Logf("cheap verify: %d steps, %d drafted, %d pauses; dear: %d steps, %d drafted, %d pauses, %v (drafting always: %v)",
		cheap.Steps, cheap.SpecDrafted, cheap.SpecPauses, dear.Steps, dear.SpecDrafted, dear.SpecPauses, took, always)
	if cheap.SpecPauses != 0 || cheap.SpecDrafted < 4*700 {
		t.Errorf("cheap verify steps: %d pauses, %d drafted; want none, most tokens drafted", cheap.SpecPauses, cheap.SpecDrafted)
	}
	if dear.SpecPauses == 0 || dear.SpecDrafted > cheap.SpecDrafted/2 || took > always/2 {
		t.Errorf("dear verify steps: %d pauses, %d drafted (cheap: %d), %v against %v drafting always; want pauses, far fewer drafts, less than half the time",
			dear.SpecPauses, dear.SpecDrafted, cheap.SpecDrafted, took, always)
	}
	for i := range cheapOut {
		if cheapOut[i] != dearOut[i] {
			t.Errorf("request %d: outputs differ", i)
		}
	}
}

// asyncFake is fakeBackend with a device sampler whose picks can stay on
// the device (backend.AsyncSampler) and graph steps that read them: a
// synchronous Sample advances the clock by hostWait (the step waits for
// the device and the host's delivery), an overlapped one does not.
type asyncFake struct {
	fakeBackend
	now      *atomic.Int64
	hostWait time.Duration
	last     []int32
}

type fakePending []backend.SampleResult

func (p fakePending) Wait() ([]backend.SampleResult, error) { return p, nil }

func (d *asyncFake) pick(logits backend.Tensor, rows []backend.SampleRow) []backend.SampleResult {
	v := logits.(fakeTensor)
	V := len(v) / len(rows)
	out := make([]backend.SampleResult, len(rows))
	for i := range rows {
		row := v[i*V : (i+1)*V]
		for k := range row {
			if row[k] > row[out[i].Token] {
				out[i].Token = int32(k)
			}
		}
	}
	return out
}

func (d *asyncFake) Sample(logits backend.Tensor, rows []backend.SampleRow) []backend.SampleResult {
	d.now.Add(int64(d.hostWait))
	return d.pick(logits, rows)
}

func (d *asyncFake) SampleAsync(logits backend.Tensor, rows []backend.SampleRow) (backend.Pending, error) {
	res := d.pick(logits, rows)
	d.last = d.last[:0]
	for _, r := range res {
		d.last = append(d.last, r.Token)
	}
	return fakePending(res), nil
}

func (d *asyncFake) GraphStep(b *backend.Batch, f func() (backend.Tensor, error)) (backend.Tensor, error) {
	for i, r := range b.Feed {
		if r >= 0 {
			b.Tokens[i] = d.last[r]
		}
	}
	b.Feed = nil
	return f()
}

// TestSpeculationMeteredSync: with a device sampler that overlaps steps,
// speculation costs even where it finds no draft — a step whose sequences
// may draft runs synchronously — and the meter, which times periods of
// speculation against pauses, stops it; the output is that of decoding
// without speculation.
func TestSpeculationMeteredSync(t *testing.T) {
	const V = 1024
	run := func(spec int) ([]string, Stats) {
		var now atomic.Int64
		m := &clockedModel{rowModel: nextModel(V, func(t int32) int32 { return (t + 1) % V }), now: &now, gate: newGate(),
			cost: func(*backend.Batch) time.Duration { return time.Millisecond }}
		be := &asyncFake{now: &now, hostWait: time.Millisecond}
		e := clockedEngine(t, m, be, spec, &now)
		var prompts [][]int32
		for i := range 4 {
			prompts = append(prompts, []int32{int32(250 * i), int32(250*i + 1)}) // no token repeats: no drafts
		}
		out := greedyTokens(t, e, m.gate, prompts, 240)
		return out, settled(t, e)
	}
	want, plain := run(0)
	got, st := run(4)
	t.Logf("without speculation: %d steps, %d overlapped; with: %d steps, %d overlapped, %d drafted, %d pauses",
		plain.Steps, plain.OverlappedSteps, st.Steps, st.OverlappedSteps, st.SpecDrafted, st.SpecPauses)
	if st.SpecDrafted != 0 {
		t.Errorf("%d tokens drafted where no token repeats", st.SpecDrafted)
	}
	if st.SpecPauses == 0 {
		t.Error("speculation that only made steps synchronous was never paused")
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("request %d: %s, want %s", i, got[i], want[i])
		}
	}
}

// TestSpeculationMeterSparesPredictions: the meter pauses prompt lookup
// where verify steps cost more than they give, but a request's prediction
// drafts through its pauses: its accepted prediction tokens are those it
// gets with the meter's clock stopped.
func TestSpeculationMeterSparesPredictions(t *testing.T) {
	const V = 1024
	next := func(t int32) int32 { // below 7 a cycle (prompt lookup's drafts all right), above a long one
		if t < 7 {
			return (t + 1) % 7
		}
		return 7 + ((t-7)*17+5)%1000
	}
	run := func(clocked bool) (Usage, Stats) {
		var now atomic.Int64
		m := &clockedModel{rowModel: nextModel(V, next), now: &now, gate: newGate(), cost: func(b *backend.Batch) time.Duration {
			return time.Millisecond + 5*time.Millisecond*time.Duration(max(0, len(b.Tokens)-4))
		}}
		opts := Options{Name: "t", Clock: stillClock}
		if clocked {
			opts.Clock = func() time.Time { return time.Unix(0, now.Load()) }
		}
		e, err := New(m, fakeBackend{}, fakeDetok{}, Config{BlockSize: 4, KVCacheBytes: 1 << 22, SpeculativeTokens: 4}, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Shutdown(context.Background())
		sp := SamplingParams{MaxTokens: 300, TopP: 1, RepetitionPenalty: 1, IgnoreEOS: true}
		// The prediction: the greedy output, from the model's rule.
		var pred []int32
		for tok := int32(100); len(pred) < 300; {
			tok = next(tok)
			pred = append(pred, tok)
		}
		chans := make([]<-chan Event, 4)
		m.gate.send(4, func(i int) {
			r := &Request{Prompt: []int32{int32(i), int32(i + 1), int32(i + 2)}, Sampling: sp} // prompts that repeat: prompt lookup drafts for them
			if i == 3 {
				r = &Request{Prompt: []int32{100}, Prediction: pred, Sampling: sp}
			}
			ch, err := e.Generate(context.Background(), r)
			if err != nil {
				t.Fatal(err)
			}
			chans[i] = ch
		})
		ch := chans[3]
		tokensOf(t, chans[:3])
		var u Usage
		for ev := range ch {
			if ev.Usage != nil {
				u = *ev.Usage
			}
		}
		return u, settled(t, e)
	}
	still, _ := run(false)
	metered, st := run(true)
	t.Logf("prediction usage, meter stopped: %+v; metered: %+v, %d pauses", still, metered, st.SpecPauses)
	if st.SpecPauses == 0 {
		t.Fatal("the meter never paused: this test shows nothing")
	}
	if metered.AcceptedPredictionTokens != still.AcceptedPredictionTokens { // (without the exemption: 250 against 265, the probes' pauses)
		t.Errorf("accepted prediction tokens %d with the meter, %d without", metered.AcceptedPredictionTokens, still.AcceptedPredictionTokens)
	}
}
