package loadgen

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// Percentiles summarise a latency sample, in milliseconds. Percentiles
// interpolate linearly between order statistics (numpy's default method):
// the p-th percentile of sorted x[0..n-1] is at rank p/100·(n-1).
type Percentiles struct {
	N    int     `json:"n"` // sample size; all fields are 0 when N is 0
	Mean float64 `json:"mean_ms"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	Max  float64 `json:"max_ms"`
}

// Summarize computes Percentiles of ms (not modified).
func Summarize(ms []float64) Percentiles {
	if len(ms) == 0 {
		return Percentiles{}
	}
	s := slices.Clone(ms)
	slices.Sort(s)
	var sum float64
	for _, v := range s {
		sum += v
	}
	return Percentiles{
		N:    len(s),
		Mean: sum / float64(len(s)),
		P50:  percentileSorted(s, 50),
		P90:  percentileSorted(s, 90),
		P99:  percentileSorted(s, 99),
		Max:  s[len(s)-1],
	}
}

// percentileSorted is the p-th percentile (0..100) of ascending s, len(s) > 0.
func percentileSorted(s []float64, p float64) float64 {
	rank := p / 100 * float64(len(s)-1)
	lo := int(math.Floor(rank))
	if lo >= len(s)-1 {
		return s[len(s)-1]
	}
	frac := rank - float64(lo)
	return s[lo] + frac*(s[lo+1]-s[lo])
}

// Arrivals are the send times of n requests, as offsets from the start:
// a Poisson process of the given rate (exponential gaps of mean 1/rate, the
// first request at 0), or all zero when rate is 0 or +Inf.
func Arrivals(n int, rate float64, seed int64) []time.Duration {
	out := make([]time.Duration, max(n, 0))
	if rate <= 0 || math.IsInf(rate, 1) || math.IsNaN(rate) {
		return out
	}
	r := newRand(seed, streamArrivals)
	var t float64 // seconds
	for i := 1; i < len(out); i++ {
		t += r.ExpFloat64() / rate
		out[i] = time.Duration(t * float64(time.Second))
	}
	return out
}

// Independent random streams derived from one seed, so that changing, say,
// the rate leaves the prompts alone.
const (
	streamArrivals = iota + 1
	streamPrompts
	streamLengths
)

func newRand(seed int64, stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(uint64(seed), 0x9e3779b97f4a7c15*stream))
}
