// Package logprob computes the log-probabilities samplers report: the
// log-softmax of raw logits at the chosen token and its best alternatives.
// The engine's sampler and the GPU sampler's host reference share it.
package logprob

import "math"

// Of returns tok's log-softmax under logits [V] and the top most likely
// ids with theirs (logit descending, lower id first on ties; NaN logits
// never listed). top ≤ 0 lists none.
func Of(logits []float32, tok int32, top int) (lp float32, ids []int32, lps []float32) {
	maxv := math.Inf(-1)
	for _, x := range logits {
		maxv = math.Max(maxv, float64(x))
	}
	var sum float64
	for _, x := range logits {
		sum += math.Exp(float64(x) - maxv)
	}
	lse := maxv + math.Log(sum)
	of := func(t int32) float32 { return float32(float64(logits[t]) - lse) }
	if top <= 0 {
		return of(tok), nil, nil
	}
	// The best `top` ids in a small sorted slice.
	best := make([]int32, 0, top+1)
	better := func(a, b int32) bool {
		return logits[a] > logits[b] || (logits[a] == logits[b] && a < b)
	}
	for i := range logits {
		t := int32(i)
		if math.IsNaN(float64(logits[t])) || (len(best) == top && !better(t, best[top-1])) {
			continue
		}
		j := len(best)
		best = append(best, t)
		for j > 0 && better(t, best[j-1]) {
			best[j] = best[j-1]
			j--
		}
		best[j] = t
		if len(best) > top {
			best = best[:top]
		}
	}
	lps = make([]float32, len(best))
	for i, t := range best {
		lps[i] = of(t)
	}
	return of(tok), best, lps
}
