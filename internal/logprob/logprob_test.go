package logprob

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
)

// TestOf checks Of against a direct float64 log-softmax and a full sort,
// on fresh random logits with ties, NaN and -Inf entries.
func TestOf(t *testing.T) {
	r := rand.New(rand.NewPCG(rand.Uint64(), 3))
	cases := []struct {
		name string
		v    int
		top  int
		ties bool
		nan  bool
	}{
		{"top0", 50, 0, false, false},
		{"top5", 200, 5, false, false},
		{"ties", 64, 8, true, false},
		{"nan_and_inf", 100, 20, false, true},
		{"top_over_vocab", 6, 10, false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			logits := make([]float32, c.v)
			for i := range logits {
				logits[i] = float32(r.NormFloat64() * 3)
				if c.ties {
					logits[i] = float32(r.IntN(4))
				}
			}
			if c.nan {
				logits[3], logits[7] = float32(math.NaN()), float32(math.Inf(-1))
			}
			tok := int32(r.IntN(c.v))
			for c.nan && (tok == 3) {
				tok = int32(r.IntN(c.v))
			}
			lp, ids, lps := Of(logits, tok, c.top)
			var finite []int32
			maxv := math.Inf(-1)
			for i, x := range logits {
				if !math.IsNaN(float64(x)) {
					finite = append(finite, int32(i))
					maxv = math.Max(maxv, float64(x))
				}
			}
			if c.nan { // a NaN logit makes the normaliser NaN, as in the engine
				if !math.IsNaN(float64(lp)) {
					t.Errorf("log-prob %g with a NaN logit, want NaN", lp)
				}
			} else {
				var sum float64
				for _, x := range logits {
					sum += math.Exp(float64(x) - maxv)
				}
				want := float64(logits[tok]) - maxv - math.Log(sum)
				if math.Abs(float64(lp)-want) > 1e-5*math.Max(1, math.Abs(want)) {
					t.Errorf("log-prob %g, want %g", lp, want)
				}
			}
			sort.SliceStable(finite, func(a, b int) bool {
				return logits[finite[a]] > logits[finite[b]] || (logits[finite[a]] == logits[finite[b]] && finite[a] < finite[b])
			})
			wantIDs := finite[:min(max(c.top, 0), len(finite))]
			if len(wantIDs) == 0 {
				wantIDs = nil
			}
			if !slices.Equal(ids, wantIDs) {
				t.Errorf("top ids %v, want %v", ids, wantIDs)
			}
			if len(lps) != len(ids) {
				t.Fatalf("%d log-probs for %d ids", len(lps), len(ids))
			}
			for i, id := range ids {
				if a, b := lps[i], float32(float64(logits[id])-float64(logits[tok])+float64(lp)); !c.nan && math.Abs(float64(a-b)) > 1e-4 {
					t.Errorf("id %d log-prob %g, want %g", id, a, b)
				}
			}
		})
	}
}
