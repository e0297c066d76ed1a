package engine

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mkserve/mkserve/backend"
)

// TestSpecMeter: the meter probes for steps without drafts when it has
// too few, pauses speculation when steps with drafts deliver fewer tokens
// a second, and not when they deliver more; the first step after a change
// of kind is not counted.
func TestSpecMeter(t *testing.T) {
	type obs struct {
		verify bool
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
	plain := obs{false, 4, 1} // 4 tokens a ms
	slow := obs{true, 8, 4}   // 2 tokens a ms
	fast := obs{true, 12, 2}  // 6 tokens a ms
	for _, c := range []struct {
		name          string
		steps         []obs
		pause, pauses int
	}{
		{"too few with drafts", cat(steps(10, plain), steps(5, slow)), 0, 0},
		{"no baseline: probe", steps(1+specMeterMin, slow), specMeterMin + 2, 0},
		{"slower with drafts", cat(steps(10, plain), steps(1+specMeterMin, slow)), specMeterPause, 1},
		{"faster with drafts", cat(steps(10, plain), steps(40, fast)), 0, 0},
		// the first plain step after drafts is skipped: 8 plain steps give 7
		// samples, too few for a verdict, so the meter probes again
		{"transition skipped", cat(steps(1+specMeterMin, slow), steps(8, plain), steps(2, slow)), specMeterMin + 2, 0},
		{"stale baseline: probe", cat(steps(10, plain), steps(1+specMeterStale, fast)), specMeterMin + 2, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			var m specMeter
			for _, o := range c.steps {
				m.tick()
				m.observe(4, o.verify, o.tokens, time.Duration(o.ms)*time.Millisecond)
			}
			if m.pause != c.pause || m.pauses != int64(c.pauses) {
				t.Errorf("pause %d, pauses %d; want %d, %d", m.pause, m.pauses, c.pause, c.pauses)
			}
		})
	}
	// Buckets: a baseline at one batch size says nothing of another.
	var m specMeter
	for range 10 {
		m.observe(4, false, 4, time.Millisecond)
	}
	for range 1 + specMeterMin {
		m.observe(32, true, 8, 100*time.Millisecond)
	}
	if m.pauses != 0 || m.pause != specMeterMin+2 {
		t.Errorf("another batch size: pause %d, pauses %d; want a probe", m.pause, m.pauses)
	}
	// Verdicts in a row double the pause; a step with drafts measured
	// faster ends the streak.
	m = specMeter{}
	for range 10 {
		m.observe(4, false, 4, time.Millisecond)
	}
	m.observe(4, true, 8, 4*time.Millisecond) // (the change of kind: not counted)
	for i, want := range []int{specMeterPause, 2 * specMeterPause, 4 * specMeterPause} {
		for range specMeterMin {
			m.observe(4, true, 8, 4*time.Millisecond)
		}
		if m.pause != want {
			t.Errorf("verdict %d: pause %d, want %d", i+1, m.pause, want)
		}
	}
	for range specMeterMin {
		m.observe(4, true, 80, time.Millisecond)
	}
	if m.streak != 0 {
		t.Errorf("faster steps with drafts: streak %d, want 0", m.streak)
	}
}

// clockedModel is a rowModel whose forward passes advance a fake clock by
// cost(batch).
type clockedModel struct {
	*rowModel
	now  *atomic.Int64 // ns
	cost func(b *backend.Batch) time.Duration
}

func (m *clockedModel) Forward(b *backend.Batch) (backend.Tensor, error) {
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
		m := &clockedModel{rowModel: nextModel(V, cycle), now: &now, cost: func(b *backend.Batch) time.Duration {
			return time.Millisecond + perDraft*time.Duration(max(0, len(b.Tokens)-4)) // (4 sequences decode)
		}}
		e, err := New(m, fakeBackend{}, fakeDetok{}, Config{BlockSize: 4, KVCacheBytes: 1 << 20, SpeculativeTokens: 4},
			Options{Name: "t", Clock: func() time.Time { return time.Unix(0, now.Load()) }})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Shutdown(context.Background())
		var chans []<-chan Event
		for i := range 4 {
			ch, err := e.Generate(context.Background(), &Request{Prompt: []int32{int32(i), int32(i + 1), 0, 1, 2, 3, 4, 5, 6},
				Sampling: SamplingParams{MaxTokens: 400, TopP: 1, RepetitionPenalty: 1, IgnoreEOS: true}})
			if err != nil {
				t.Fatal(err)
			}
			chans = append(chans, ch)
		}
		var out []string
		for _, ch := range chans {
			var toks []int32
			for ev := range ch {
				if ev.Err != nil {
					t.Fatal(ev.Err)
				}
				toks = append(toks, ev.TokenIDs...)
			}
			out = append(out, fmt.Sprint(toks))
		}
		return out, e.Stats(), time.Duration(now.Load())
	}
	cheapOut, cheap, _ := run(0)
	const perDraft = 5 * time.Millisecond
	dearOut, dear, took := run(perDraft)
	// Drafting at every step (as the cheap run does) would take each of
	// its steps at the dear price: 4 sequences of 4 draft tokens.
	always := time.Duration(cheap.Steps) * (time.Millisecond + 16*perDraft)
	t.Logf("cheap verify: %d steps, %d drafted, %d pauses; dear: %d steps, %d drafted, %d pauses, %v (drafting always: %v)",
		cheap.Steps, cheap.SpecDrafted, cheap.SpecPauses, dear.Steps, dear.SpecDrafted, dear.SpecPauses, took, always)
	if cheap.SpecPauses != 0 || cheap.SpecDrafted < 4*300 {
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
