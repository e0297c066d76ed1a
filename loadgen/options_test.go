package loadgen

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestParseDist(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Dist
		err  string // substring of the error; "" for none
	}{
		{"128", Fixed(128), ""},
		{" 7 ", Fixed(7), ""},
		{"64:256", Uniform(64, 256), ""},
		{"uniform:1:1", Uniform(1, 1), ""},
		{"UNIFORM:3:9", Uniform(3, 9), ""},
		{"normal:100:10", Dist{Kind: DistNormal, Lo: 70, Hi: 130, Mean: 100, Std: 10}, ""},
		{"normal:2:5", Dist{Kind: DistNormal, Lo: 1, Hi: 17, Mean: 2, Std: 5}, ""},
		{"normal:50:0", Dist{Kind: DistNormal, Lo: 50, Hi: 50, Mean: 50, Std: 0}, ""},
		{"", Dist{}, "not an integer"},
		{"abc", Dist{}, "not an integer"},
		{"0", Dist{}, "bounds"},
		{"-4", Dist{}, "bounds"},
		{"9:3", Dist{}, "bounds"},
		{"1:99999999", Dist{}, "bounds"},
		{"uniform:a:3", Dist{}, "not integers"},
		{"normal:5", Dist{}, "not integers"},
		{"normal:x:1", Dist{}, "not numbers"},
		{"normal:10:-1", Dist{}, "std"},
		{"normal:NaN:1", Dist{}, "finite"},
		{"normal:0.2:0", Dist{}, "mean"},
		{"zipf:1:2", Dist{}, "unknown form"},
		{"1:2:3:4", Dist{}, "unknown form"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseDist(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ParseDist(%q) = %+v, %v; want error with %q", tc.in, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseDist(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestDistSample(t *testing.T) {
	r := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	const n = 20000
	for _, tc := range []struct {
		d        Dist
		mean     float64 // expected mean
		meanTol  float64
		seeAllOf bool // every value of [Lo, Hi] must come up
	}{
		{Fixed(17), 17, 0, true},
		{Uniform(1, 10), 5.5, 0.1, true},
		{Uniform(100, 100), 100, 0, true},
		{Normal(200, 20), 200, 1, false},
		{Normal(3, 10), -1, 0, false}, // clipped hard: only bounds checked
	} {
		t.Run(tc.d.String(), func(t *testing.T) {
			seen := map[int]bool{}
			var sum float64
			for range n {
				v := tc.d.Sample(r)
				if v < tc.d.Lo || v > tc.d.Hi {
					t.Fatalf("sample %d outside [%d, %d]", v, tc.d.Lo, tc.d.Hi)
				}
				seen[v] = true
				sum += float64(v)
			}
			if tc.mean >= 0 && math.Abs(sum/n-tc.mean) > tc.meanTol {
				t.Errorf("mean %.3f, want %.3f ± %.3f", sum/n, tc.mean, tc.meanTol)
			}
			if tc.seeAllOf && len(seen) != tc.d.Hi-tc.d.Lo+1 {
				t.Errorf("saw %d distinct values of %d", len(seen), tc.d.Hi-tc.d.Lo+1)
			}
		})
	}
}

func TestEndpointURL(t *testing.T) {
	for _, tc := range []struct{ base, ep, want string }{
		{"http://127.0.0.1:8000", "", "http://127.0.0.1:8000/v1/completions"},
		{"http://127.0.0.1:8000/", "chat", "http://127.0.0.1:8000/v1/chat/completions"},
		{"http://h/v1", "completions", "http://h/v1/completions"},
		{"https://h/prefix/v1/", "chat", "https://h/prefix/v1/chat/completions"},
	} {
		o := Options{BaseURL: tc.base, Endpoint: tc.ep}
		if got, err := o.endpointURL(); err != nil || got != tc.want {
			t.Errorf("%q %q: %q, %v; want %q", tc.base, tc.ep, got, err, tc.want)
		}
	}
}

// FuzzParseDist: no input panics; what parses is valid, samples stay in
// bounds, and String parses back to the same Dist.
func FuzzParseDist(f *testing.F) {
	for _, s := range []string{"1", "64:256", "uniform:3:9", "normal:100:10", "normal:1e3:1e9", "x", ":", "normal::"} {
		f.Add(s)
	}
	r := rand.New(rand.NewPCG(1, 2))
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDist(s)
		if err != nil {
			return
		}
		if err := d.validate(); err != nil {
			t.Fatalf("ParseDist(%q) returned an invalid %+v: %v", s, d, err)
		}
		for range 8 {
			if v := d.Sample(r); v < d.Lo || v > d.Hi {
				t.Fatalf("%+v sampled %d", d, v)
			}
		}
		back, err := ParseDist(d.String())
		if err != nil || back != d {
			t.Fatalf("%q -> %+v -> %q -> %+v, %v", s, d, d.String(), back, err)
		}
	})
}
