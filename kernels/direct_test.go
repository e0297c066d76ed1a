package kernels

import (
	"math"
	"strings"
	"sync"
	"testing"
)

// TestDirectMode: in direct mode GPU calls run on the callers' goroutines
// (their threads locked for the call): GEMMs issued from several goroutines
// at once come out right, a failing call's error text reaches the caller
// that made it, and switching back restores the owning goroutine.
func TestDirectMode(t *testing.T) {
	g := testGPU(t)
	if err := g.SetDirect(true); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := g.SetDirect(false); err != nil {
			t.Errorf("back to the owning goroutine: %v", err)
		}
	}()
	const m, n, k = 9, 33, 40
	var wg sync.WaitGroup
	errs := make([]string, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := newRNG(t)
			aBits, a := randBF16(r, m*k, 1)
			bBits, b := randBF16(r, n*k, 1)
			var got []float32
			onGPU(t, g, func(ar *arena) {
				ab, bb := put(ar, aBits), put(ar, bBits)
				cb := put(ar, fill32(m*n, float32(math.NaN())))
				if ar.err != nil {
					return
				}
				ar.check(ar.d.Gemm(nil, cb, F32, ab, bb, m, n, k))
				got = get[float32](ar, cb, m*n)
			})
			for i := 0; i < m; i++ {
				for j := 0; j < n; j++ {
					var s float64
					for p := 0; p < k; p++ {
						s += float64(a[i*k+p]) * float64(b[j*k+p])
					}
					if d := math.Abs(float64(got[i*n+j]) - s); !(d <= 1e-3*(1+math.Abs(s))) {
						errs[w] = "wrong product"
						return
					}
				}
			}
			// A bad call: its text must be this call's.
			err := g.Do(func(d *Device) error {
				return d.lib.check("mk_gemm_bf16", d.lib.gemm(0, 0, 0, 0, 0, int64(-1-w), 1, 1, 0))
			})
			if err == nil || !strings.Contains(err.Error(), "bad shape") {
				errs[w] = "bad call: " + func() string {
					if err == nil {
						return "no error"
					}
					return err.Error()
				}()
			}
		}()
	}
	wg.Wait()
	for w, e := range errs {
		if e != "" {
			t.Errorf("goroutine %d: %s", w, e)
		}
	}
}
