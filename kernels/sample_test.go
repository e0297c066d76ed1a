package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"
)

// sampleLogits draws one row of V logits of the given kind: "normal"
// (normal × 3), "ties" (normal × 3 rounded to halves: many equal values),
// "dominant" (one token 30 above the rest), "neginf" (a third of the
// entries −Inf), "flat" (all equal: every cut is a tie broken by id),
// "nan" (a few NaN entries), "narrow" (normal × 0.01: the kept sets of
// top-p are large).
func sampleLogits(r *rand.Rand, V int, kind string) []float32 {
	v := make([]float32, V)
	for i := range v {
		v[i] = float32(r.NormFloat64() * 3)
	}
	switch kind {
	case "ties":
		for i := range v {
			v[i] = float32(math.Round(float64(v[i])*2) / 2)
		}
	case "dominant":
		v[r.IntN(V)] += 30
	case "neginf":
		for i := range v {
			if r.IntN(3) == 0 {
				v[i] = float32(math.Inf(-1))
			}
		}
		v[r.IntN(V)] = 1 // at least one finite
	case "flat":
		c := float32(r.NormFloat64())
		for i := range v {
			v[i] = c
		}
	case "nan":
		for k := 0; k < 1+V/1000; k++ {
			v[r.IntN(V)] = float32(math.NaN())
		}
	case "narrow":
		for i := range v {
			v[i] *= 0.01 / 3
		}
	}
	return v
}

var sampleKinds = []string{"normal", "ties", "dominant", "neginf", "flat", "nan", "narrow"}

// distinctIDs draws n distinct ids in [0, V).
func distinctIDs(r *rand.Rand, n, V int) []int32 {
	n = min(n, V)
	seen := map[int32]bool{}
	out := make([]int32, 0, n)
	for len(out) < n {
		t := int32(r.IntN(V))
		if !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	return out
}

// randSampleRow draws random sampling parameters, penalties included.
func randSampleRow(r *rand.Rand, V int) SampleRow {
	pick := func(v ...float32) float32 { return v[r.IntN(len(v))] }
	row := SampleRow{
		Temperature:       pick(0, 0.3, 0.8, 1, 1.5),
		TopK:              []int{0, 0, 1, 5, 50, 1000, 5000}[r.IntN(7)],
		TopP:              pick(1, 1, 0.9, 0.5, 0.95, 0.999),
		MinP:              pick(0, 0, 0, 0.05, 0.2),
		RepetitionPenalty: 1,
		U:                 r.Float64(),
		TopLogprobs:       []int{0, 0, 1, 5, 20}[r.IntN(5)],
	}
	if r.IntN(3) == 0 {
		row.RepetitionPenalty = pick(1.1, 1.3, 0.8)
		row.Seen = distinctIDs(r, 1+r.IntN(300), V)
	}
	if r.IntN(3) == 0 {
		row.PresencePenalty = pick(0, 0.5, -0.5, 1.5)
		row.FrequencyPenalty = pick(0, 0.2, -0.3, 1)
		row.Output = distinctIDs(r, 1+r.IntN(100), V)
		row.Counts = make([]int32, len(row.Output))
		for i := range row.Counts {
			row.Counts[i] = int32(1 + r.IntN(5))
		}
	}
	return row
}

// sampleCheck compares one device result with the host reference; a token
// that differs only where the reference's margin is under 1e-6 counts as a
// boundary case (returned true), anything else fails.
func sampleCheck(tb testing.TB, name string, V int, row *SampleRow, got, want SampleOut, margin float64) (boundary bool) {
	tb.Helper()
	if got.Token < 0 || int(got.Token) >= V {
		tb.Errorf("%s: token %d outside [0, %d)", name, got.Token, V)
		return false
	}
	if got.Token != want.Token {
		if margin < 1e-6 {
			tb.Logf("%s: boundary case: token %d, reference %d, reference margin %.3g (params %+v)", name, got.Token, want.Token, margin, paramsOf(row))
			return true
		}
		tb.Errorf("%s: token %d, want %d (reference margin %.3g; params %+v)", name, got.Token, want.Token, margin, paramsOf(row))
		return false
	}
	closeLP := func(a, b float32) bool {
		if math.IsNaN(float64(b)) {
			return math.IsNaN(float64(a))
		}
		if math.IsInf(float64(b), 0) {
			return a == b
		}
		return math.Abs(float64(a)-float64(b)) <= 1e-4
	}
	if !closeLP(got.Logprob, want.Logprob) {
		tb.Errorf("%s: logprob %v, want %v", name, got.Logprob, want.Logprob)
	}
	if len(got.TopIDs) != len(want.TopIDs) || len(got.TopLogp) != len(want.TopIDs) {
		tb.Errorf("%s: %d/%d alternatives, want %d", name, len(got.TopIDs), len(got.TopLogp), len(want.TopIDs))
		return false
	}
	for k := range want.TopIDs {
		if got.TopIDs[k] != want.TopIDs[k] || !closeLP(got.TopLogp[k], want.TopLogp[k]) {
			tb.Errorf("%s: alternative %d is %d (%v), want %d (%v)", name, k, got.TopIDs[k], got.TopLogp[k], want.TopIDs[k], want.TopLogp[k])
			return false
		}
	}
	return false
}

// paramsOf is row without its token lists, for messages.
func paramsOf(r *SampleRow) string {
	return fmt.Sprintf("T=%v topk=%d topp=%v minp=%v rep=%v pres=%v freq=%v seen=%d out=%d U=%.6f top=%d",
		r.Temperature, r.TopK, r.TopP, r.MinP, r.RepetitionPenalty, r.PresencePenalty, r.FrequencyPenalty,
		len(r.Seen), len(r.Output), r.U, r.TopLogprobs)
}

// sampleOnGPU uploads logits, poisons B rows of results, lets launch run a
// sampling kernel into them (out) and unpacks what it wrote.
func sampleOnGPU(tb testing.TB, g *GPU, logits []float32, B int, launch func(a *arena, out, lb *Buffer)) []SampleOut {
	tb.Helper()
	var words []int32
	onGPU(tb, g, func(a *arena) {
		lb := put(a, logits)
		poison := make([]int32, B*SampleResultWords)
		for i := range poison {
			poison[i] = int32(0x7fc00000) // NaN bits, also a huge token id
		}
		ob := put(a, poison)
		if a.err != nil {
			return
		}
		launch(a, ob, lb)
		words = get[int32](a, ob, B*SampleResultWords)
	})
	out, err := UnpackSample(words, B)
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// runSample runs SampleF32 on logits [B, V] with the output poisoned.
func runSample(tb testing.TB, g *GPU, logits []float32, rows []SampleRow, V int) []SampleOut {
	tb.Helper()
	B := len(rows)
	meta, pen, err := PackSample(rows, V)
	if err != nil {
		tb.Fatal(err)
	}
	return sampleOnGPU(tb, g, logits, B, func(a *arena, ob, lb *Buffer) {
		mb := put(a, meta)
		var sb *Buffer
		if pen {
			sb = put(a, fill32(B*V, float32(math.NaN())))
		}
		if a.err == nil {
			a.check(a.d.SampleF32(nil, ob, lb, mb, len(meta), sb, B, V))
		}
	})
}

// TestSampleMatchesHost: random logits of every kind, random parameters,
// B up to 64, V from 7 to 151936, against SampleHost (the engine's sampler
// followed literally).
func TestSampleMatchesHost(t *testing.T) {
	g := testGPU(t)
	r := newRNG(t)
	cases := []struct{ B, V, reps int }{
		{1, 7, 40}, {5, 7, 20}, {3, 100, 20}, {64, 1000, 3}, {17, 4099, 4}, {64, 32000, 2}, {8, 151936, 2}, {2, 129280, 1},
	}
	var rowsRun, boundary int
	for _, c := range cases {
		for rep := 0; rep < c.reps; rep++ {
			name := fmt.Sprintf("B%d_V%d_%d", c.B, c.V, rep)
			logits := make([]float32, 0, c.B*c.V)
			rows := make([]SampleRow, c.B)
			kinds := make([]string, c.B)
			for b := range rows {
				kinds[b] = sampleKinds[r.IntN(len(sampleKinds))]
				logits = append(logits, sampleLogits(r, c.V, kinds[b])...)
				rows[b] = randSampleRow(r, c.V)
			}
			host := append([]float32(nil), logits...)
			got := runSample(t, g, logits, rows, c.V)
			for b := range rows {
				want, margin := SampleHost(host[b*c.V:(b+1)*c.V], &rows[b])
				if sampleCheck(t, fmt.Sprintf("%s row %d (%s)", name, b, kinds[b]), c.V, &rows[b], got[b], want, margin) {
					boundary++
				}
				rowsRun++
			}
		}
	}
	t.Logf("%d rows, %d boundary cases", rowsRun, boundary)
	if boundary*100 > rowsRun {
		t.Errorf("%d boundary cases in %d rows: not rare", boundary, rowsRun)
	}
}

// TestSampleTable: hand-picked cases whose answers are known, including
// the slow path (kept sets over 4096 tokens) and every tie rule.
func TestSampleTable(t *testing.T) {
	r := newRNG(t)
	const V = 20000
	flat := make([]float32, V)
	for i := range flat {
		flat[i] = 0.25
	}
	cases := []struct {
		name   string
		logits []float32
		row    SampleRow
		want   int32 // -1: only compare with SampleHost
	}{
		{"greedy ties lowest id", flat, SampleRow{TopP: 1, RepetitionPenalty: 1}, 0},
		{"flat top-p 0.95 slow path", flat, SampleRow{Temperature: 1, TopP: 0.95, RepetitionPenalty: 1, U: 0.50001}, 9500},
		{"flat top-k 5000 slow path", flat, SampleRow{Temperature: 1, TopK: 5000, TopP: 1, RepetitionPenalty: 1, U: 0.9999}, 4999},
		{"flat top-k 3 draw", flat, SampleRow{Temperature: 0.7, TopK: 3, TopP: 1, RepetitionPenalty: 1, U: 0.5}, 1},
		{"flat min-p all kept", flat, SampleRow{Temperature: 1, TopP: 1, MinP: 0.5, RepetitionPenalty: 1, U: 0.25001}, 5000},
		{"flat drawAll", flat, SampleRow{Temperature: 1, TopP: 1, RepetitionPenalty: 1, U: 0.75001}, 15000},
		{"flat top logprobs", flat, SampleRow{TopP: 1, RepetitionPenalty: 1, TopLogprobs: 20}, 0},
		{"repetition penalty moves argmax", flat, SampleRow{TopP: 1, RepetitionPenalty: 2, Seen: []int32{0, 1, 2}}, 3},
		{"presence penalty moves argmax", flat, SampleRow{TopP: 1, RepetitionPenalty: 1, PresencePenalty: 1, Output: []int32{0}, Counts: []int32{1}}, 1},
		{"negative penalty raises a token", flat, SampleRow{TopP: 1, RepetitionPenalty: 1, FrequencyPenalty: -0.1, Output: []int32{777, 5}, Counts: []int32{1, 3}}, 5},
		{"narrow top-p 0.95", sampleLogits(r, V, "narrow"), SampleRow{Temperature: 1, TopP: 0.95, RepetitionPenalty: 1, U: r.Float64(), TopLogprobs: 5}, -1},
		{"narrow top-p + min-p", sampleLogits(r, V, "narrow"), SampleRow{Temperature: 1, TopP: 0.9, MinP: 0.99, RepetitionPenalty: 1, U: r.Float64()}, -1},
		{"narrow top-k 4097 top-p", sampleLogits(r, V, "narrow"), SampleRow{Temperature: 1, TopK: 4097, TopP: 0.7, RepetitionPenalty: 1, U: r.Float64()}, -1},
	}
	rows := make([]SampleRow, len(cases))
	var logits []float32
	for i, c := range cases {
		rows[i] = c.row
		logits = append(logits, c.logits...)
	}
	wants := make([]SampleOut, len(cases))
	margins := make([]float64, len(cases))
	for i, c := range cases {
		wants[i], margins[i] = SampleHost(c.logits, &rows[i])
		if c.want >= 0 && wants[i].Token != c.want {
			t.Errorf("%s: the host reference gives %d, want %d", c.name, wants[i].Token, c.want)
		}
	}
	if len(wants[6].TopIDs) != 20 || wants[6].TopIDs[19] != 19 {
		t.Errorf("flat top logprobs: the host reference gives %v, want 0..19", wants[6].TopIDs)
	}
	g := testGPU(t) // the host checks above run everywhere
	got := runSample(t, g, logits, rows, V)
	for i, c := range cases {
		sampleCheck(t, c.name, V, &rows[i], got[i], wants[i], margins[i])
	}
}

// TestSampleBadArgs: bad metadata and buffers are errors.
func TestSampleBadArgs(t *testing.T) {
	if _, _, err := PackSample([]SampleRow{{TopP: 1, RepetitionPenalty: 1, TopLogprobs: 21}}, 10); err == nil {
		t.Error("TopLogprobs 21 accepted")
	}
	if _, _, err := PackSample([]SampleRow{{TopP: 1, RepetitionPenalty: 1, Seen: []int32{10}}}, 10); err == nil {
		t.Error("a token id outside the vocabulary accepted")
	}
	if _, _, err := PackSample([]SampleRow{{TopP: 1, RepetitionPenalty: 1, U: 1}}, 10); err == nil {
		t.Error("U = 1 accepted")
	}
	if _, _, err := PackSample([]SampleRow{{TopP: 1, RepetitionPenalty: 1, Output: []int32{1}}}, 10); err == nil {
		t.Error("output without counts accepted")
	}
	g := testGPU(t)
	err := g.Do(func(d *Device) error {
		a := &arena{d: d}
		defer a.free()
		lb, ob, mb := a.alloc(4*10), a.alloc(4*SampleResultWords), a.alloc(4*SampleMetaWords)
		if a.err != nil {
			return a.err
		}
		if err := d.SampleF32(nil, ob, lb, mb, SampleMetaWords, nil, 2, 10); err == nil {
			return fmt.Errorf("2 rows in buffers for 1 accepted")
		}
		if err := d.SampleF32(nil, ob, lb, mb, SampleMetaWords, nil, 1, 0); err == nil {
			return fmt.Errorf("vocab 0 accepted")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// BenchmarkSampleKernel times SampleF32 alone with CUDA events (median of 5
// batches of 20 launches), on Zipf-like rows (the token of rank r has logit
// −1.5·ln(r+1), ranks scattered per row), typical settings (temperature
// 0.8, top-p 0.9, top-k 50) and greedy.
func BenchmarkSampleKernel(b *testing.B) {
	g := testGPU(b)
	for _, V := range []int{32000, 151936} {
		for _, B := range []int{1, 32, 256} {
			logits := make([]float32, B*V)
			for r := 0; r < B; r++ {
				mul := 7919 + 2*r
				for i := 0; i < V; i++ {
					logits[r*V+i] = float32(-1.5 * math.Log(float64((i*mul+r)%V+1)))
				}
			}
			for _, typical := range []bool{true, false} {
				name := fmt.Sprintf("V=%d/B=%d/greedy", V, B)
				rows := make([]SampleRow, B)
				for i := range rows {
					rows[i] = SampleRow{TopP: 1, RepetitionPenalty: 1, U: float64(i) / float64(B)}
					if typical {
						rows[i].Temperature, rows[i].TopP, rows[i].TopK = 0.8, 0.9, 50
					}
				}
				if typical {
					name = fmt.Sprintf("V=%d/B=%d/typical", V, B)
				}
				b.Run(name, func(b *testing.B) {
					meta, _, err := PackSample(rows, V)
					if err != nil {
						b.Fatal(err)
					}
					var med float64
					err = g.Do(func(d *Device) error {
						a := &arena{d: d}
						defer a.free()
						lb, mb, ob := put(a, logits), put(a, meta), a.alloc(int64(B*SampleResultWords*4))
						e0, err := d.NewEvent()
						if err != nil {
							return err
						}
						defer e0.Destroy()
						e1, err := d.NewEvent()
						if err != nil {
							return err
						}
						defer e1.Destroy()
						if a.err != nil {
							return a.err
						}
						var ms []float64
						for k := 0; k < 6; k++ {
							if err := e0.Record(nil); err != nil {
								return err
							}
							for i := 0; i < 20; i++ {
								if err := d.SampleF32(nil, ob, lb, mb, len(meta), nil, B, V); err != nil {
									return err
								}
							}
							if err := e1.Record(nil); err != nil {
								return err
							}
							if err := e1.Sync(); err != nil {
								return err
							}
							t, err := Elapsed(e0, e1)
							if err != nil {
								return err
							}
							if k > 0 { // the first batch warms up
								ms = append(ms, float64(t)*1000/20)
							}
						}
						sort.Float64s(ms)
						med = ms[len(ms)/2]
						return nil
					})
					if err != nil {
						b.Fatal(err)
					}
					b.ReportMetric(med, "µs/call")
					b.ReportMetric(0, "ns/op")
				})
			}
		}
	}
}

// runSplitSample runs the split sampling kernels on B rows of V logits
// into results poisoned beforehand: the greedy ones when meta is nil, else
// the draw ones with meta (PackSample's), kmax and cuts (DrawSplit's).
func runSplitSample(tb testing.TB, g *GPU, logits []float32, meta []int32, B, V, kmax int, cuts bool) []SampleOut {
	tb.Helper()
	return sampleOnGPU(tb, g, logits, B, func(a *arena, ob, lb *Buffer) {
		if meta == nil {
			wb := a.alloc(a.d.SampleGreedyWork(B, V))
			if a.err == nil {
				a.check(a.d.SampleGreedyF32(nil, ob, lb, wb, B, V))
			}
			return
		}
		mb, wb := put(a, meta), a.alloc(a.d.SampleDrawWork(B, V, kmax))
		if a.err == nil {
			a.check(a.d.SampleDrawF32(nil, ob, lb, mb, len(meta), wb, B, V, kmax, cuts))
		}
	})
}

// randomRows is B rows of V logits of random kinds (their names in kinds)
// and their sampling rows: a draw at a temperature in [0.3, 2) with a
// uniform, no top-k / top-p / min-p or penalties, then changed by edit.
func randomRows(r *rand.Rand, B, V int, edit func(row *SampleRow)) (logits []float32, rs []SampleRow, kinds []string) {
	logits = make([]float32, 0, B*V)
	rs, kinds = make([]SampleRow, B), make([]string, B)
	for b := range rs {
		kinds[b] = sampleKinds[r.IntN(len(sampleKinds))]
		logits = append(logits, sampleLogits(r, V, kinds[b])...)
		rs[b] = SampleRow{TopP: 1, RepetitionPenalty: 1, U: r.Float64(), Temperature: float32(0.3 + 1.7*r.Float64())}
		edit(&rs[b])
	}
	return logits, rs, kinds
}

// TestSampleGreedySplit: the split greedy kernel gives the host sampler's
// token (first index of the max; 0 for a row of NaN) and log-probability
// (NaN when a logit is NaN or the max is ±Inf) for every kind of row, at
// vocabularies below, at and past its chunk, and the same token as the
// general kernel; ties and special values are placed across chunks.
func TestSampleGreedySplit(t *testing.T) {
	g := testGPU(t)
	r := newRNG(t)
	greedy := SampleRow{TopP: 1, RepetitionPenalty: 1}
	if !GreedyOnly([]SampleRow{greedy}) || GreedyOnly([]SampleRow{greedy, {Temperature: 1, TopP: 1, RepetitionPenalty: 1}}) ||
		GreedyOnly([]SampleRow{{TopP: 1, RepetitionPenalty: 1, TopLogprobs: 1}}) ||
		GreedyOnly([]SampleRow{{TopP: 1, RepetitionPenalty: 2, Seen: []int32{3}}}) || GreedyOnly(nil) {
		t.Fatal("GreedyOnly misclassifies rows")
	}
	special := map[string]func(v []float32){
		"all nan": func(v []float32) {
			for i := range v {
				v[i] = float32(math.NaN())
			}
		},
		"tie across chunks": func(v []float32) {
			m := float32(40)
			v[len(v)-1], v[len(v)/2], v[len(v)/3] = m, m, m
		},
		"+inf twice": func(v []float32) { v[len(v)-1], v[len(v)/2] = float32(math.Inf(1)), float32(math.Inf(1)) },
		"all -inf": func(v []float32) {
			for i := range v {
				v[i] = float32(math.Inf(-1))
			}
		},
		"nan first": func(v []float32) { v[0] = float32(math.NaN()) },
	}
	var names []string
	for k := range special {
		names = append(names, k)
	}
	sort.Strings(names)
	rows := 0
	for _, c := range []struct{ B, V int }{{1, 7}, {3, 2048}, {2, 2049}, {64, 32000}, {1, 151936}, {5, 129280}, {1, 201088}} {
		logits := make([]float32, 0, c.B*c.V)
		kinds := make([]string, c.B)
		for b := 0; b < c.B; b++ {
			kinds[b] = sampleKinds[r.IntN(len(sampleKinds))]
			v := sampleLogits(r, c.V, kinds[b])
			if b < len(names) && c.V > 3 && r.IntN(2) == 0 {
				kinds[b] = names[b]
				special[names[b]](v)
			}
			logits = append(logits, v...)
		}
		rs := make([]SampleRow, c.B)
		for b := range rs {
			rs[b] = greedy
		}
		general := runSample(t, g, logits, rs, c.V)
		got := runSplitSample(t, g, logits, nil, c.B, c.V, 0, false)
		for b := range rs {
			name := fmt.Sprintf("B%d V%d row %d (%s)", c.B, c.V, b, kinds[b])
			want, margin := SampleHost(logits[b*c.V:(b+1)*c.V], &rs[b])
			sampleCheck(t, name, c.V, &rs[b], got[b], want, margin)
			if got[b].Token != general[b].Token {
				t.Errorf("%s: split kernel token %d, general kernel %d", name, got[b].Token, general[b].Token)
			}
			rows++
		}
	}
	t.Logf("%d rows", rows)
	onGPU(t, g, func(a *arena) {
		b := a.alloc(64)
		if a.err == nil {
			if err := a.d.SampleGreedyF32(nil, b, b, b, 1, 1000); err == nil {
				t.Error("logits smaller than one row: no error")
			}
		}
	})
}

// TestSampleDrawSplit: the split draw kernels (rows greedy or drawing over
// the whole vocabulary) against the host sampler on every kind of row,
// temperatures 0.3–2 and random draws, vocabularies below, at and past a
// chunk and across many chunks; a token may differ only where the host's
// decision was within rounding of a boundary (rare), as for sample_rows.
func TestSampleDrawSplit(t *testing.T) {
	g := testGPU(t)
	r := newRNG(t)
	onGPU(t, g, func(a *arena) {
		d := a.d
		lim := d.SampleDrawKMax(151936)
		for _, c := range []struct {
			rows       []SampleRow
			ok         bool
			kmax, vs   int
			allow, cut bool
		}{
			{[]SampleRow{{Temperature: 1, TopP: 1, RepetitionPenalty: 1}, {TopP: 1, RepetitionPenalty: 1}}, true, 0, 151936, false, false},
			{[]SampleRow{{Temperature: 1, TopP: 0.9, RepetitionPenalty: 1}}, false, 0, 151936, false, false},
			{[]SampleRow{{Temperature: 1, TopP: 1, MinP: 0.1, RepetitionPenalty: 1}}, false, 0, 151936, false, false},
			{[]SampleRow{{Temperature: 1, TopP: 0.9, RepetitionPenalty: 1}, {Temperature: 1, TopP: 1, TopK: 5, RepetitionPenalty: 1}}, true, lim, 151936, true, true},
			{[]SampleRow{{Temperature: 1, TopP: 1, MinP: 0.1, RepetitionPenalty: 1}}, true, lim, 151936, true, true},
			{[]SampleRow{{Temperature: 1, TopP: 1, TopK: 5, RepetitionPenalty: 1}}, true, 5, 151936, true, false},
			{[]SampleRow{{Temperature: 1, TopP: 0.9, TopK: 5, RepetitionPenalty: 1}, {Temperature: 1, TopP: 1, TopK: 20, MinP: 0.1, RepetitionPenalty: 1}}, true, 20, 151936, false, false},
			{[]SampleRow{{Temperature: 1, TopP: 1, TopK: lim, RepetitionPenalty: 1}}, true, lim, 151936, false, false},
			{[]SampleRow{{Temperature: 1, TopP: 1, TopK: lim + 1, RepetitionPenalty: 1}}, false, 0, 151936, true, false},
			{[]SampleRow{{Temperature: 1, TopP: 1, TopK: 5, RepetitionPenalty: 2, Seen: []int32{3}}}, false, 0, 151936, true, false},
			{[]SampleRow{{Temperature: 1, TopP: 1, TopK: 5, RepetitionPenalty: 1, TopLogprobs: 1}}, false, 0, 151936, true, false},
		} {
			ok, kmax, cut := d.DrawSplit(c.rows, c.vs, c.allow)
			if ok != c.ok || (ok && (kmax != c.kmax || cut != c.cut)) {
				t.Errorf("DrawSplit(%+v, %v) = %v, %d, %v; want %v, %d, %v", c.rows, c.allow, ok, kmax, cut, c.ok, c.kmax, c.cut)
			}
		}
		if lim < 20 || d.SampleDrawKMax(7) != 2048 {
			t.Errorf("SampleDrawKMax: %d for Qwen3's vocabulary, %d for 7 tokens", lim, d.SampleDrawKMax(7))
		}
	})
	rows, boundary := 0, 0
	for _, c := range []struct{ B, V, reps int }{{1, 7, 20}, {4, 2048, 5}, {3, 2049, 5}, {64, 32000, 2}, {2, 151936, 4}, {5, 129280, 2}} {
		for rep := 0; rep < c.reps; rep++ {
			logits, rs, kinds := randomRows(r, c.B, c.V, func(row *SampleRow) {
				if r.IntN(4) == 0 {
					row.Temperature = 0
				}
			})
			meta, _, err := PackSample(rs, c.V)
			if err != nil {
				t.Fatal(err)
			}
			got := runSplitSample(t, g, logits, meta, c.B, c.V, 0, false)
			for b := range rs {
				want, margin := SampleHost(logits[b*c.V:(b+1)*c.V], &rs[b])
				if sampleCheck(t, fmt.Sprintf("B%d V%d rep %d row %d (%s, T %.2f)", c.B, c.V, rep, b, kinds[b], rs[b].Temperature),
					c.V, &rs[b], got[b], want, margin) {
					boundary++
				}
				rows++
			}
		}
	}
	rareBoundaries(t, rows, boundary)
}

// rareBoundaries logs the rows checked and fails when more than 1 % were
// boundary cases (the host's decision within rounding).
func rareBoundaries(t *testing.T, rows, boundary int) {
	t.Helper()
	t.Logf("%d rows, %d boundary cases", rows, boundary)
	if boundary*100 > rows {
		t.Errorf("%d boundary cases in %d rows: not rare", boundary, rows)
	}
}

// checkDrawSplit samples rows (of kinds) of logits [len(rows), V] with the
// split draw kernels (DrawSplit's choice, cut rows allowed with allowCuts)
// and checks every row against the host sampler and the general kernel;
// it returns the rows where the host's decision was within rounding of a
// boundary, less those of flat rows: every cut of a flat row whose kept
// count times top-p is a whole number (top-k 20, top-p 0.5) is an exact
// tie, a boundary by construction, not a sign of drift (call 119 drew two
// such rows in 144).
func checkDrawSplit(t *testing.T, g *GPU, logits []float32, rows []SampleRow, kinds []string, V int, allowCuts bool,
	what string) (boundary int) {
	t.Helper()
	var ok, cuts bool
	var kmax int
	onGPU(t, g, func(a *arena) { ok, kmax, cuts = a.d.DrawSplit(rows, V, allowCuts) })
	if !ok {
		t.Fatalf("%s: DrawSplit refused %+v", what, rows)
	}
	meta, _, err := PackSample(rows, V)
	if err != nil {
		t.Fatal(err)
	}
	got := runSplitSample(t, g, logits, meta, len(rows), V, kmax, cuts)
	general := runSample(t, g, logits, rows, V)
	for b := range rows {
		name := fmt.Sprintf("%s row %d (%s, %+v)", what, b, kinds[b], paramsOf(&rows[b]))
		want, margin := SampleHost(logits[b*V:(b+1)*V], &rows[b])
		if sampleCheck(t, name, V, &rows[b], got[b], want, margin) {
			if kinds[b] != "flat" {
				boundary++
			}
		} else if got[b].Token != general[b].Token && margin >= 1e-6 {
			t.Errorf("%s: split kernels token %d, general kernel %d", name, got[b].Token, general[b].Token)
		}
	}
	return boundary
}

// checkSplitRandom runs checkDrawSplit on calls of random rows, edit
// choosing each row's sampling (lim: the vocabulary's top-k limit), at
// vocabularies below, at and past a chunk and across many chunks (B32k
// rows at Mixtral's 32 000), and checks that boundary cases are rare.
func checkSplitRandom(t *testing.T, g *GPU, r *rand.Rand, B32k int, allowCuts bool, edit func(row *SampleRow, lim int)) {
	t.Helper()
	rows, boundary := 0, 0
	for _, c := range []struct{ B, V, reps int }{{1, 7, 20}, {4, 2048, 5}, {3, 2049, 5}, {B32k, 32000, 2}, {3, 151936, 5}, {5, 129280, 2}} {
		var lim int
		onGPU(t, g, func(a *arena) { lim = a.d.SampleDrawKMax(c.V) })
		for rep := 0; rep < c.reps; rep++ {
			logits, rs, kinds := randomRows(r, c.B, c.V, func(row *SampleRow) { edit(row, lim) })
			boundary += checkDrawSplit(t, g, logits, rs, kinds, c.V, allowCuts, fmt.Sprintf("B%d V%d rep %d", c.B, c.V, rep))
			rows += c.B
		}
	}
	rareBoundaries(t, rows, boundary)
}

// TestSampleTopKSplit: rows with top-k (1 to the vocabulary's limit, with
// and without top-p and min-p) mixed in one call with greedy rows and rows
// that draw over the whole vocabulary, against the host sampler and the
// general kernel, on every kind of row, vocabularies below, at and past a
// chunk and across many chunks; a token may differ only where the host's
// decision was within rounding of a boundary (rare). A top-k above the
// call's kmax gets token -2.
func TestSampleTopKSplit(t *testing.T) {
	g := testGPU(t)
	r := newRNG(t)
	checkSplitRandom(t, g, r, 32, false, func(row *SampleRow, lim int) {
		switch r.IntN(6) {
		case 0: // greedy
			row.Temperature = 0
		case 1: // over the whole vocabulary
		default:
			ks := []int{1, 2, 5, 20, 40, lim}
			row.TopK = min(ks[r.IntN(len(ks))], lim)
			if r.IntN(2) == 0 {
				row.TopP = []float32{0.5, 0.9, 0.95}[r.IntN(3)]
			}
			if r.IntN(3) == 0 {
				row.MinP = []float32{0.01, 0.05, 0.3}[r.IntN(3)]
			}
		}
	})
	// A top-k above kmax: token -2.
	const V = 4096
	logits := sampleLogits(r, V, sampleKinds[0])
	rs := []SampleRow{{Temperature: 1, TopK: 9, TopP: 1, RepetitionPenalty: 1, U: 0.5}}
	meta, _, err := PackSample(rs, V)
	if err != nil {
		t.Fatal(err)
	}
	onGPU(t, g, func(a *arena) {
		ob, lb, mb := a.alloc(4*SampleResultWords), put(a, logits), put(a, meta)
		wb := a.alloc(a.d.SampleDrawWork(1, V, 8))
		if a.err != nil {
			return
		}
		a.check(a.d.SampleDrawF32(nil, ob, lb, mb, len(meta), wb, 1, V, 8, false))
		if tok := get[int32](a, ob, 1)[0]; tok != -2 {
			t.Errorf("top-k 9 with kmax 8: token %d, want -2", tok)
		}
		if err := a.d.SampleDrawF32(nil, ob, lb, mb, len(meta), wb, 1, V, a.d.SampleDrawKMax(V)+1, false); err == nil {
			t.Error("kmax above SampleDrawKMax accepted")
		}
		if err := a.d.SampleDrawF32(nil, ob, lb, mb, len(meta), wb, 1, V, 0, true); err == nil {
			t.Error("cut rows with kmax 0 accepted")
		}
	})
}

// TestSampleCutSplit: rows with top-p or min-p but no top-k (split mode 3,
// opt-in) in calls with top-k,
// whole-vocabulary and greedy rows, against the host sampler and the
// general kernel: rows whose kept set lies inside their chunks' best tokens
// are answered from them, the others (flat rows, top-p 0.99) by the
// general kernel in the same call; every kind of row, vocabularies below,
// at and past a chunk and across many chunks.
func TestSampleCutSplit(t *testing.T) {
	g := testGPU(t)
	r := newRNG(t)
	checkSplitRandom(t, g, r, 16, true, func(row *SampleRow, _ int) {
		switch r.IntN(8) {
		case 0: // greedy
			row.Temperature = 0
		case 1: // over the whole vocabulary
		case 2:
			row.TopK = 1 + r.IntN(20)
		default:
			if r.IntN(4) != 0 {
				row.TopP = []float32{0.3, 0.5, 0.9, 0.95, 0.99}[r.IntN(5)]
			}
			if row.TopP == 1 || r.IntN(3) == 0 {
				row.MinP = []float32{0.01, 0.05, 0.3}[r.IntN(3)]
			}
		}
	})
	// A chunk's tokens past its candidates outrank another chunk's
	// candidates: chunk 0 holds 1000 near-equal high logits (more than its
	// candidates), chunk 1 one at 4 and the rest low. Min-p 0.3 cuts among
	// the candidates (chunk 1's low ones) while ~1000 tokens are kept, and
	// top-p 0.5 crosses inside chunk 0's candidates with more of chunk 0
	// before it in the row's order: neither proves the kept set inside the
	// candidates (the first version drew from them; twenty-first pass).
	const V = 32 * 2048 // 32 chunks: 128 candidates a chunk
	row := make([]float32, V)
	for i := range row {
		row[i] = -10 + 0.001*float32(r.IntN(1000))
	}
	for i := range 1000 {
		row[i] = 5 + 0.0001*float32(r.IntN(1000))
	}
	row[2048] = 4
	var logits []float32
	var rs []SampleRow
	var kinds []string
	for _, c := range []struct {
		minp, topp float32
		u          float64
	}{{0.3, 1, 0.9}, {0.3, 1, 0.5}, {0, 0.5, 0.7}, {0.3, 0.5, 0.2}} {
		logits = append(logits, row...)
		rs = append(rs, SampleRow{Temperature: 1, TopP: c.topp, MinP: c.minp, RepetitionPenalty: 1, U: c.u})
		kinds = append(kinds, "chunk0 past its candidates")
	}
	if boundary := checkDrawSplit(t, g, logits, rs, kinds, V, true, "outranked candidates"); boundary > 0 {
		t.Errorf("outranked candidates: %d boundary cases in 4 fixed rows", boundary)
	}
}
