package loadgen

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

func TestSummarizeTable(t *testing.T) {
	// Expected values follow numpy.percentile's default (linear) method,
	// worked by hand: rank p/100·(n-1) between order statistics.
	for _, tc := range []struct {
		name string
		in   []float64
		want Percentiles
	}{
		{"empty", nil, Percentiles{}},
		{"one", []float64{5}, Percentiles{N: 1, Mean: 5, P50: 5, P90: 5, P99: 5, Max: 5}},
		{"two", []float64{10, 0}, Percentiles{N: 2, Mean: 5, P50: 5, P90: 9, P99: 9.9, Max: 10}},
		{"four", []float64{4, 1, 3, 2}, Percentiles{N: 4, Mean: 2.5, P50: 2.5, P90: 3.7, P99: 3.97, Max: 4}},
		{"ten", []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, Percentiles{N: 10, Mean: 5.5, P50: 5.5, P90: 9.1, P99: 9.91, Max: 10}},
		{"ties", []float64{10, 1, 7, 3, 3}, Percentiles{N: 5, Mean: 4.8, P50: 3, P90: 8.8, P99: 9.88, Max: 10}},
		{"hundred and one", seq(0, 100), Percentiles{N: 101, Mean: 50, P50: 50, P90: 90, P99: 99, Max: 100}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]float64(nil), tc.in...)
			got := Summarize(in)
			if !closePct(got, tc.want, 1e-9) {
				t.Errorf("Summarize(%v) = %+v, want %+v", tc.in, got, tc.want)
			}
			for i := range in {
				if in[i] != tc.in[i] {
					t.Fatal("Summarize modified its input")
				}
			}
		})
	}
}

// TestSummarizeRandom checks against a reference that finds order
// statistics by counting (no sorting) on fresh random samples.
func TestSummarizeRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	for range 50 {
		n := 1 + r.IntN(200)
		x := make([]float64, n)
		for i := range x {
			x[i] = math.Round(r.ExpFloat64()*1000) / 10 // ties happen
		}
		got := Summarize(x)
		var mean float64
		for _, v := range x {
			mean += v / float64(n)
		}
		want := Percentiles{N: n, Mean: mean, P50: refPct(x, 50), P90: refPct(x, 90), P99: refPct(x, 99), Max: kth(x, n-1)}
		if !closePct(got, want, 1e-9) {
			t.Fatalf("n=%d: got %+v, want %+v", n, got, want)
		}
	}
}

// kth is the k-th smallest element (0-based): the v with fewer than k+1
// elements below it and at least k+1 at or below it.
func kth(x []float64, k int) float64 {
	for _, v := range x {
		below, atOrBelow := 0, 0
		for _, u := range x {
			if u < v {
				below++
			}
			if u <= v {
				atOrBelow++
			}
		}
		if below <= k && k < atOrBelow {
			return v
		}
	}
	panic("unreachable")
}

func refPct(x []float64, p float64) float64 {
	h := p / 100 * float64(len(x)-1)
	lo := math.Floor(h)
	a := kth(x, int(lo))
	if int(lo)+1 >= len(x) {
		return a
	}
	return a + (h-lo)*(kth(x, int(lo)+1)-a)
}

func seq(lo, hi int) []float64 {
	var out []float64
	for i := hi; i >= lo; i-- {
		out = append(out, float64(i))
	}
	return out
}

func closePct(a, b Percentiles, tol float64) bool {
	near := func(x, y float64) bool { return math.Abs(x-y) <= tol*max(1, math.Abs(y)) }
	return a.N == b.N && near(a.Mean, b.Mean) && near(a.P50, b.P50) && near(a.P90, b.P90) && near(a.P99, b.P99) && near(a.Max, b.Max)
}

func TestArrivalsPoisson(t *testing.T) {
	const n, rate = 20001, 50.0
	a := Arrivals(n, rate, 7)
	if a[0] != 0 {
		t.Fatalf("first arrival at %v, want 0", a[0])
	}
	var sum, sumSq float64
	for i := 1; i < n; i++ {
		g := (a[i] - a[i-1]).Seconds()
		if g < 0 {
			t.Fatalf("arrivals not increasing at %d", i)
		}
		sum += g
		sumSq += g * g
	}
	mean := sum / (n - 1)
	std := math.Sqrt(sumSq/(n-1) - mean*mean)
	// Exponential gaps: mean 1/rate, coefficient of variation 1. With 20000
	// gaps the standard error of the mean is 0.7%, so 3% is over 4 sigma.
	if math.Abs(mean*rate-1) > 0.03 {
		t.Errorf("mean gap %.5fs, want %.5fs ± 3%%", mean, 1/rate)
	}
	if cv := std / mean; math.Abs(cv-1) > 0.05 {
		t.Errorf("coefficient of variation %.3f, want 1 ± 0.05", cv)
	}
	b := Arrivals(n, rate, 7)
	c := Arrivals(n, rate, 8)
	if b[n-1] != a[n-1] || c[n-1] == a[n-1] {
		t.Error("arrivals do not follow the seed")
	}
}

func TestArrivalsAllAtOnce(t *testing.T) {
	for _, rate := range []float64{0, math.Inf(1)} {
		for i, d := range Arrivals(5, rate, 1) {
			if d != 0 {
				t.Errorf("rate %v: arrival %d at %v, want 0", rate, i, d)
			}
		}
	}
	if len(Arrivals(0, 1, 1)) != 0 || len(Arrivals(-3, 1, 1)) != 0 {
		t.Error("no requests should give no arrivals")
	}
}

var sinkP Percentiles

func BenchmarkSummarize(b *testing.B) {
	x := make([]float64, 10_000)
	for i := range x {
		x[i] = rand.ExpFloat64()
	}
	for b.Loop() {
		sinkP = Summarize(x)
	}
}

var sinkA []time.Duration

func BenchmarkArrivals(b *testing.B) {
	for b.Loop() {
		sinkA = Arrivals(10_000, 100, 1)
	}
}
