package attention

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// refCausal is attention written straight from the definition, in float64.
func refCausal(q, k, v []float32, Tq, past int, p *Params) []float64 {
	H, KV, D, Dv := p.NumHeads, p.NumKVHeads, p.HeadDim, p.VHeadDim
	out := make([]float64, Tq*H*Dv)
	for t := range Tq {
		i := past + t
		for h := range H {
			kh := h / (H / KV)
			var js []int
			for j := 0; j <= i; j++ {
				if p.Window == 0 || j > i-p.Window {
					js = append(js, j)
				}
			}
			s := make([]float64, len(js))
			mx := math.Inf(-1)
			for n, j := range js {
				var d float64
				for x := range D {
					d += float64(q[(t*H+h)*D+x]) * float64(k[(j*KV+kh)*D+x])
				}
				s[n] = d * float64(p.Scale)
				mx = math.Max(mx, s[n])
			}
			if p.Sinks != nil {
				mx = math.Max(mx, float64(p.Sinks[h]))
			}
			var sum float64
			for n := range s {
				s[n] = math.Exp(s[n] - mx)
				sum += s[n]
			}
			if p.Sinks != nil {
				sum += math.Exp(float64(p.Sinks[h]) - mx)
			}
			for n, j := range js {
				for x := range Dv {
					out[(t*H+h)*Dv+x] += s[n] / sum * float64(v[(j*KV+kh)*Dv+x])
				}
			}
		}
	}
	return out
}

type causalCase struct {
	name             string
	H, KV, D, Dv     int
	Tq, past, window int
	sinks            bool
	qScale           float32 // spread of q (large → peaked softmax)
}

var causalCases = []causalCase{
	{name: "mha prefill", H: 4, KV: 4, D: 16, Dv: 16, Tq: 7},
	{name: "gqa4 chunked prefill", H: 8, KV: 2, D: 32, Dv: 32, Tq: 5, past: 11},
	{name: "gqa8 decode", H: 8, KV: 1, D: 8, Dv: 8, Tq: 1, past: 40},
	{name: "gqa1 decode past 1", H: 2, KV: 2, D: 12, Dv: 12, Tq: 1, past: 1},
	{name: "first token", H: 4, KV: 1, D: 8, Dv: 8, Tq: 1},
	{name: "window smaller than sequence", H: 4, KV: 2, D: 16, Dv: 16, Tq: 9, past: 6, window: 4},
	{name: "window 1 (self only)", H: 2, KV: 1, D: 8, Dv: 8, Tq: 5, past: 3, window: 1},
	{name: "window larger than sequence", H: 4, KV: 2, D: 16, Dv: 16, Tq: 6, past: 3, window: 100},
	{name: "sinks full", H: 4, KV: 2, D: 16, Dv: 16, Tq: 5, past: 4, sinks: true},
	{name: "sinks window decode gqa8", H: 8, KV: 1, D: 16, Dv: 16, Tq: 1, past: 30, window: 8, sinks: true},
	{name: "mla Dv < D", H: 4, KV: 4, D: 24, Dv: 12, Tq: 4, past: 5},
	{name: "Dv > D, odd dims", H: 6, KV: 3, D: 6, Dv: 10, Tq: 3, past: 2},
	{name: "peaked logits (stability)", H: 4, KV: 2, D: 32, Dv: 32, Tq: 4, past: 8, qScale: 40},
	{name: "parallel sized", H: 16, KV: 4, D: 64, Dv: 64, Tq: 33, past: 64, window: 50, sinks: true},
}

func (c causalCase) inputs(rng *rand.Rand) (q, k, v []float32, p *Params) {
	qs := c.qScale
	if qs == 0 {
		qs = 1
	}
	n := c.past + c.Tq
	q = randVec(rng, c.Tq*c.H*c.D, qs)
	k = randVec(rng, n*c.KV*c.D, 1)
	v = randVec(rng, n*c.KV*c.Dv, 1)
	p = &Params{NumHeads: c.H, NumKVHeads: c.KV, HeadDim: c.D, VHeadDim: c.Dv,
		Scale: float32(1 / math.Sqrt(float64(c.D))), Window: c.window}
	if c.sinks {
		p.Sinks = randVec(rng, c.H, 2)
	}
	return q, k, v, p
}

func TestCausalMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, c := range causalCases {
		t.Run(c.name, func(t *testing.T) {
			q, k, v, p := c.inputs(rng)
			out := make([]float32, c.Tq*c.H*c.Dv)
			for i := range out {
				out[i] = float32(math.NaN()) // must be overwritten
			}
			Causal(out, q, k, v, c.Tq, c.past, p)
			want := refCausal(q, k, v, c.Tq, c.past, p)
			// Score errors grow with the logits' size.
			tol := 2e-5 * float64(max(c.qScale, 1))
			for i := range out {
				if d := math.Abs(float64(out[i]) - want[i]); !(d <= tol*(1+math.Abs(want[i]))) {
					t.Fatalf("out[%d] (row %d) = %v, want %v", i, i/(c.H*c.Dv), out[i], want[i])
				}
			}
		})
	}
}

// TestCausalSplitInvariance: decoding one token at a time, or prefilling in
// chunks, gives bit-for-bit the rows of a single prefill call.
func TestCausalSplitInvariance(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	for _, c := range []causalCase{
		{name: "gqa4", H: 8, KV: 2, D: 16, Dv: 16, Tq: 24},
		{name: "gqa8 sinks window", H: 8, KV: 1, D: 8, Dv: 8, Tq: 20, window: 5, sinks: true},
		{name: "mla dims", H: 3, KV: 3, D: 20, Dv: 12, Tq: 17},
	} {
		t.Run(c.name, func(t *testing.T) {
			q, k, v, p := c.inputs(rng)
			H, KV, D, Dv := c.H, c.KV, c.D, c.Dv
			full := make([]float32, c.Tq*H*Dv)
			Causal(full, q, k, v, c.Tq, 0, p)
			for _, chunk := range []int{1, 3, 7} {
				for past := 0; past < c.Tq; past += chunk {
					tq := min(chunk, c.Tq-past)
					n := past + tq
					out := make([]float32, tq*H*Dv)
					Causal(out, q[past*H*D:n*H*D], k[:n*KV*D], v[:n*KV*Dv], tq, past, p)
					for i, x := range out {
						if want := full[past*H*Dv+i]; x != want {
							t.Fatalf("chunk %d at past %d: out[%d] = %v, prefill %v", chunk, past, i, x, want)
						}
					}
				}
			}
		})
	}
}

// TestCausalWindowCoversAll: a window at least as long as the sequence is
// exactly full causal attention.
func TestCausalWindowCoversAll(t *testing.T) {
	c := causalCase{H: 4, KV: 2, D: 16, Dv: 16, Tq: 6, past: 5}
	q, k, v, p := c.inputs(rand.New(rand.NewPCG(15, 16)))
	a := make([]float32, c.Tq*c.H*c.Dv)
	Causal(a, q, k, v, c.Tq, c.past, p)
	for _, w := range []int{c.Tq + c.past, 1000} {
		pw := *p
		pw.Window = w
		b := make([]float32, len(a))
		Causal(b, q, k, v, c.Tq, c.past, &pw)
		for i := range a {
			if a[i] != b[i] {
				t.Fatalf("window %d: out[%d] = %v, full causal %v", w, i, b[i], a[i])
			}
		}
	}
	// A smaller window must change something.
	pw := *p
	pw.Window = 3
	b := make([]float32, len(a))
	Causal(b, q, k, v, c.Tq, c.past, &pw)
	same := true
	for i := range a {
		same = same && a[i] == b[i]
	}
	if same {
		t.Fatal("window 3 gave the full causal result")
	}
}

func TestParamsValidate(t *testing.T) {
	ok := Params{NumHeads: 8, NumKVHeads: 2, HeadDim: 16, VHeadDim: 16, Scale: 0.25}
	for _, c := range []struct {
		name string
		edit func(*Params)
		want string
	}{
		{"ok", func(*Params) {}, ""},
		{"no heads", func(p *Params) { p.NumHeads = 0 }, "NumHeads"},
		{"gqa ratio", func(p *Params) { p.NumKVHeads = 3 }, "multiple"},
		{"head dim", func(p *Params) { p.VHeadDim = 0 }, "VHeadDim"},
		{"scale zero", func(p *Params) { p.Scale = 0 }, "Scale"},
		{"scale nan", func(p *Params) { p.Scale = float32(math.NaN()) }, "Scale"},
		{"window", func(p *Params) { p.Window = -1 }, "Window"},
		{"sinks", func(p *Params) { p.Sinks = make([]float32, 3) }, "sinks"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := ok
			c.edit(&p)
			err := p.Validate()
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one mentioning %q", err, c.want)
			}
		})
	}
}

func TestCausalPanicsOnBadShapes(t *testing.T) {
	p := &Params{NumHeads: 4, NumKVHeads: 2, HeadDim: 8, VHeadDim: 8, Scale: 0.3}
	mk := func(n int) []float32 { return make([]float32, n) }
	for _, c := range []struct {
		name, want string
		f          func()
	}{
		{"short k", "len(k)", func() { Causal(mk(2*32), mk(2*32), mk(4*16-1), mk(4*16), 2, 2, p) }},
		{"long v", "len(v)", func() { Causal(mk(2*32), mk(2*32), mk(4*16), mk(5*16), 2, 2, p) }},
		{"out", "len(out)", func() { Causal(mk(32), mk(2*32), mk(4*16), mk(4*16), 2, 2, p) }},
		{"negative past", "past", func() { Causal(mk(32), mk(32), mk(16), mk(16), 1, -1, p) }},
		{"bad params", "NumKVHeads", func() { Causal(nil, nil, nil, nil, 0, 0, &Params{NumHeads: 4, HeadDim: 1, VHeadDim: 1, Scale: 1}) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(fmt.Sprint(r), c.want) {
					t.Fatalf("panic %v, want one mentioning %q", r, c.want)
				}
			}()
			c.f()
		})
	}
}

func benchCausal(b *testing.B, H, KV, D, Tq, past int) {
	rng := rand.New(rand.NewPCG(1, 2))
	n := past + Tq
	q, k, v := randVec(rng, Tq*H*D, 1), randVec(rng, n*KV*D, 1), randVec(rng, n*KV*D, 1)
	out := make([]float32, Tq*H*D)
	p := &Params{NumHeads: H, NumKVHeads: KV, HeadDim: D, VHeadDim: D, Scale: float32(1 / math.Sqrt(float64(D)))}
	// q·k and p·v: 2 flops each per (query, visible key, head, dim).
	pairs := float64(Tq)*float64(past) + float64(Tq)*float64(Tq+1)/2
	for b.Loop() {
		Causal(out, q, k, v, Tq, past, p)
	}
	b.ReportMetric(4*pairs*float64(H*D)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// Qwen3-30B-A3B attention (32 q heads, 4 kv heads, head 128).
func BenchmarkCausalDecode4k(b *testing.B)   { benchCausal(b, 32, 4, 128, 1, 4095) }
func BenchmarkCausalPrefill512(b *testing.B) { benchCausal(b, 32, 4, 128, 512, 0) }

// TestCausalPagedSameBits: CausalPaged over keys and values scattered in a
// pool through a shuffled block table gives Causal's rows on the gathered
// copy bit for bit, for every case and block sizes 1, 3, 16 and one block
// for all; a block outside the pool panics.
func TestCausalPagedSameBits(t *testing.T) {
	for _, c := range causalCases {
		for _, bs := range []int{1, 3, 16, 1 << 20} {
			t.Run(fmt.Sprintf("%s/bs%d", c.name, bs), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(21, uint64(bs)))
				q, k, v, p := c.inputs(rng)
				n := c.past + c.Tq
				want := make([]float32, c.Tq*c.H*c.Dv)
				Causal(want, q, k, v, c.Tq, c.past, p)

				bsz := min(bs, max(n, 1))
				nb := (n + bsz - 1) / bsz
				spare := 3
				kw, vw := c.KV*c.D, c.KV*c.Dv
				blocks := make([]int32, nb)
				for i, b := range rng.Perm(nb + spare)[:nb] {
					blocks[i] = int32(b)
				}
				pool := &Pool{K: randVec(rng, (nb+spare)*bsz*kw, 1), V: randVec(rng, (nb+spare)*bsz*vw, 1),
					Blocks: blocks, BlockSize: bsz}
				for j := range n {
					r := int(blocks[j/bsz])*bsz + j%bsz
					copy(pool.K[r*kw:(r+1)*kw], k[j*kw:])
					copy(pool.V[r*vw:(r+1)*vw], v[j*vw:])
				}
				if gk, gv := pool.Gather(n, kw, vw); !slicesEqual(gk, k) || !slicesEqual(gv, v) {
					t.Fatal("Gather does not give back the keys and values put in the pool")
				}
				got := make([]float32, len(want))
				CausalPaged(got, q, pool, c.Tq, c.past, p)
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("out[%d] = %v, gathered %v", i, got[i], want[i])
					}
				}
				if nb > 0 {
					bad := *pool
					bad.Blocks = append([]int32(nil), blocks...)
					bad.Blocks[0] = int32(nb + spare)
					defer func() {
						if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "outside a pool") {
							t.Fatalf("block outside the pool: recovered %v", r)
						}
					}()
					CausalPaged(got, q, &bad, c.Tq, c.past, p)
				}
			})
		}
	}
}

// TestCausalPagedValuesInKeys: a pool whose values are each kv head's first
// VHeadDim key columns (Pool.ValuesInKeys, V nil) gives Causal's bits on
// keys that hold those values, and Gather (one kv head) gives them back.
func TestCausalPagedValuesInKeys(t *testing.T) {
	for _, c := range append(causalCases, causalCase{name: "mla-like decode", H: 8, KV: 1, D: 40, Dv: 32, Tq: 1, past: 37},
		causalCase{name: "mla-like chunk", H: 4, KV: 1, D: 24, Dv: 16, Tq: 6, past: 9}) {
		if c.Dv > c.D {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(29, uint64(c.D)))
			q, k, v, p := c.inputs(rng)
			n := c.past + c.Tq
			kw, vw := c.KV*c.D, c.KV*c.Dv
			for j := range n { // each head's value moves into its key's first columns
				for h := range c.KV {
					copy(k[j*kw+h*c.D:j*kw+h*c.D+c.Dv], v[j*vw+h*c.Dv:j*vw+(h+1)*c.Dv])
				}
			}
			want := make([]float32, c.Tq*c.H*c.Dv)
			Causal(want, q, k, v, c.Tq, c.past, p)
			const bs = 4
			nb := (n + bs - 1) / bs
			blocks := make([]int32, nb)
			for i, b := range rng.Perm(nb + 2)[:nb] {
				blocks[i] = int32(b)
			}
			pool := &Pool{K: randVec(rng, (nb+2)*bs*kw, 1), Blocks: blocks, BlockSize: bs, ValuesInKeys: true}
			for j := range n {
				r := int(blocks[j/bs])*bs + j%bs
				copy(pool.K[r*kw:(r+1)*kw], k[j*kw:])
			}
			got := make([]float32, len(want))
			CausalPaged(got, q, pool, c.Tq, c.past, p)
			if !slicesEqual(got, want) {
				t.Fatal("values in keys: not Causal's bits")
			}
			if c.KV == 1 {
				if gk, gv := pool.Gather(n, kw, vw); !slicesEqual(gk, k) || !slicesEqual(gv, v) {
					t.Fatal("Gather does not give back the keys and the values inside them")
				}
			}
		})
	}
}

func slicesEqual(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// toBF16Pool is p's keys and values rounded to bf16 (nearest even): the
// bf16 pool and the float32 pool of the same (widened) values.
func toBF16Pool(p *Pool) (bf, widened *Pool) {
	round := func(x []float32) ([]uint16, []float32) {
		if x == nil {
			return nil, nil
		}
		b, w := make([]uint16, len(x)), make([]float32, len(x))
		for i, v := range x {
			u := math.Float32bits(v)
			u += 0x7fff + (u>>16)&1
			b[i] = uint16(u >> 16)
			w[i] = math.Float32frombits(uint32(b[i]) << 16)
		}
		return b, w
	}
	bf, widened = &Pool{Blocks: p.Blocks, BlockSize: p.BlockSize, ValuesInKeys: p.ValuesInKeys}, &Pool{Blocks: p.Blocks, BlockSize: p.BlockSize, ValuesInKeys: p.ValuesInKeys}
	bf.K16, widened.K = round(p.K)
	bf.V16, widened.V = round(p.V)
	return bf, widened
}

// TestCausalPagedBF16: a pool held in bf16 (Pool.K16, V16) gives the
// results of the float32 pool of the widened values bit for bit — values
// apart and in the keys — and Gather widens it.
func TestCausalPagedBF16(t *testing.T) {
	for _, c := range append(causalCases, causalCase{name: "mla-like decode", H: 8, KV: 1, D: 40, Dv: 32, Tq: 1, past: 37}) {
		for _, inKeys := range []bool{false, true} {
			if inKeys && c.Dv > c.D {
				continue
			}
			t.Run(fmt.Sprintf("%s/inKeys=%v", c.name, inKeys), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(31, uint64(c.D)))
				q, _, _, p := c.inputs(rng)
				n := c.past + c.Tq
				const bs = 4
				nb := (n + bs - 1) / bs
				blocks := make([]int32, nb)
				for i, b := range rng.Perm(nb + 2)[:nb] {
					blocks[i] = int32(b)
				}
				kw, vw := c.KV*c.D, c.KV*c.Dv
				pool := &Pool{K: randVec(rng, (nb+2)*bs*kw, 1), Blocks: blocks, BlockSize: bs, ValuesInKeys: inKeys}
				if !inKeys {
					pool.V = randVec(rng, (nb+2)*bs*vw, 1)
				}
				bf, wide := toBF16Pool(pool)
				want, got := make([]float32, c.Tq*c.H*c.Dv), make([]float32, c.Tq*c.H*c.Dv)
				CausalPaged(want, q, wide, c.Tq, c.past, p)
				CausalPaged(got, q, bf, c.Tq, c.past, p)
				if !slicesEqual(got, want) {
					t.Fatal("bf16 pool: not the widened float32 pool's bits")
				}
				if c.KV == 1 || !inKeys {
					gk, gv := bf.Gather(n, kw, vw)
					wk, wv := wide.Gather(n, kw, vw)
					if !slicesEqual(gk, wk) || !slicesEqual(gv, wv) {
						t.Fatal("Gather of the bf16 pool differs from the widened pool's")
					}
				}
			})
		}
	}
}
