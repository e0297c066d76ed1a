package moe

import (
	"fmt"
	"math"
	"runtime"
	"sync"
)

// Route picks cfg.TopK experts for each of T tokens.
//
// logits is [T, E] (E = cfg.NumExperts), scoreBias is [E] or nil (DeepSeek-V3's
// e_score_correction_bias: it moves the choice, never the weights). It returns
// ids [T*K] and weights [T*K], row-major by token; see RouterConfig for the
// exact formula.
//
// Order of the K outputs of a token: descending weight, ties to the lower
// expert index. Ties in every top-k (group choice, expert choice) also go to
// the lower index, which is what torch.topk does on CPU and CUDA in practice
// (it documents no order); NaN ranks above every number, as in torch.topk.
//
// Route panics when cfg fails Validate or a slice is shorter than its shape:
// loaders validate configs once, so that is a programming error here. NaN or
// infinite logits do not panic; they give NaN weights as torch would.
func Route(cfg *RouterConfig, logits []float32, scoreBias []float32, T int) (ids []int32, weights []float32) {
	if err := cfg.Validate(); err != nil {
		panic("moe.Route: " + err.Error())
	}
	E, K := cfg.NumExperts, cfg.TopK
	if T < 0 || len(logits) < T*E {
		panic(fmt.Sprintf("moe.Route: logits has %d values, want T*E = %d*%d", len(logits), T, E))
	}
	if scoreBias != nil && len(scoreBias) != E {
		panic(fmt.Sprintf("moe.Route: scoreBias has %d values, want NumExperts = %d", len(scoreBias), E))
	}
	ids = make([]int32, T*K)
	weights = make([]float32, T*K)
	// Small batches (decode) run on the caller's goroutine; large ones
	// (prefill) split tokens across cores.
	workers := 1
	if T*E >= 1<<15 {
		workers = min(runtime.GOMAXPROCS(0), T)
	}
	if workers <= 1 {
		var s routeScratch
		for t := range T {
			routeToken(cfg, logits[t*E:t*E+E], scoreBias, ids[t*K:t*K+K], weights[t*K:t*K+K], &s)
		}
		return ids, weights
	}
	var wg sync.WaitGroup
	chunk := (T + workers - 1) / workers
	for t0 := 0; t0 < T; t0 += chunk {
		t1 := min(t0+chunk, T)
		wg.Add(1)
		go func() {
			defer wg.Done()
			var s routeScratch
			for t := t0; t < t1; t++ {
				routeToken(cfg, logits[t*E:t*E+E], scoreBias, ids[t*K:t*K+K], weights[t*K:t*K+K], &s)
			}
		}()
	}
	wg.Wait()
	return ids, weights
}

// routeScratch is per-goroutine working memory of Route.
type routeScratch struct {
	scores []float32 // [E]
	choice []float32 // [E]
	group  []float32 // [G]
	gsel   []int32   // [TopKGroups]
	exp    []float64 // [E]
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// routeToken routes one token: row [E] → ids [K], w [K].
func routeToken(cfg *RouterConfig, row, bias []float32, ids []int32, w []float32, s *routeScratch) {
	E, K := cfg.NumExperts, cfg.TopK

	// 1. scores.
	scores := row
	switch {
	case cfg.Scoring == Sigmoid:
		s.scores = grow(s.scores, E)
		scores = s.scores
		for e, v := range row {
			scores[e] = float32(1 / (1 + math.Exp(-float64(v))))
		}
	case !cfg.SoftmaxTopK:
		s.scores = grow(s.scores, E)
		scores = s.scores
		softmax(scores, row, &s.exp)
	}

	// 2–3. choice scores: bias, then group mask.
	choice := scores
	if bias != nil || cfg.NumGroups > 0 {
		s.choice = grow(s.choice, E)
		choice = s.choice
		copy(choice, scores)
		for e, b := range bias {
			choice[e] += b
		}
	}
	if G := cfg.NumGroups; G > 0 {
		gs := E / G
		s.group = grow(s.group, G)
		var two [2]int32
		for g := range G {
			c := choice[g*gs : g*gs+gs]
			topK(c, two[:])
			s.group[g] = c[two[0]] + c[two[1]]
		}
		s.gsel = grow(s.gsel, cfg.TopKGroups)
		topK(s.group, s.gsel)
		for g := range G {
			keep := false
			for _, k := range s.gsel {
				if int(k) == g {
					keep = true
					break
				}
			}
			if !keep {
				// transformers 5.17, vLLM and DeepSeek's reference code mask
				// dropped groups with -inf (older transformers used 0.0,
				// which let a masked expert beat a negative biased score).
				for e := range choice[g*gs : g*gs+gs] {
					choice[g*gs+e] = float32(math.Inf(-1))
				}
			}
		}
	}

	// 4. top-k on the choice scores.
	topK(choice, ids)

	// 5. weights from the un-biased scores.
	for k, e := range ids {
		w[k] = scores[e]
	}
	if cfg.SoftmaxTopK {
		softmax(w, w, &s.exp)
	}
	if cfg.NormTopK {
		var sum float32
		for _, v := range w {
			sum += v
		}
		if cfg.Scoring == Sigmoid {
			sum += 1e-20
		}
		for k := range w {
			w[k] /= sum
		}
	}
	if f := cfg.ScalingFactor; f != 0 && f != 1 {
		for k := range w {
			w[k] *= f
		}
	}

	// Output order: descending weight, ties to the lower expert index.
	for i := 1; i < K; i++ {
		for j := i; j > 0 && ranksBefore(w[j], int(ids[j]), w[j-1], int(ids[j-1])); j-- {
			w[j], w[j-1] = w[j-1], w[j]
			ids[j], ids[j-1] = ids[j-1], ids[j]
		}
	}
}

// softmax writes softmax(x) into dst (which may alias x), computed in
// float64 and rounded once; tmp is scratch, grown as needed.
func softmax(dst, x []float32, tmp *[]float64) {
	m := math.Inf(-1)
	for _, v := range x {
		if f := float64(v); f > m || f != f {
			m = f
			if f != f {
				break
			}
		}
	}
	*tmp = grow(*tmp, len(x))
	ex := *tmp
	var sum float64
	for i, v := range x {
		ex[i] = math.Exp(float64(v) - m)
		sum += ex[i]
	}
	for i, e := range ex {
		dst[i] = float32(e / sum)
	}
}

// ranksBefore reports whether value a at index ia ranks before b at ib in a
// top-k: larger first, NaN above every number, ties to the lower index.
func ranksBefore(a float32, ia int, b float32, ib int) bool {
	switch {
	case a > b:
		return true
	case a < b:
		return false
	case a == b:
		return ia < ib
	}
	// At least one NaN.
	if an, bn := a != a, b != b; an != bn {
		return an
	}
	return ia < ib
}

// topK writes the indices of the len(out) best values of v into out, best
// first (ranksBefore order). len(out) <= len(v).
func topK(v []float32, out []int32) {
	k := len(out)
	n := 0
	for i, x := range v {
		if n == k {
			last := int(out[k-1])
			if !ranksBefore(x, i, v[last], last) {
				continue
			}
			n--
		}
		j := n
		for ; j > 0 && ranksBefore(x, i, v[out[j-1]], int(out[j-1])); j-- {
			out[j] = out[j-1]
		}
		out[j] = int32(i)
		n++
	}
}
