package kernels

import (
	"math"
	"strings"
	"testing"
)

// traceWords lays records out as a control workspace holds them.
func traceWords(room, wanted int, recs []MoETraceRec) []uint64 {
	w := make([]uint64, moeFusedTraceOffset/8+room*moeFusedTraceWords)
	w[moeFusedTraceCap/2] |= uint64(uint32(room)) << (32 * (moeFusedTraceCap % 2))
	w[moeFusedTraceCount/2] |= uint64(uint32(wanted)) << (32 * (moeFusedTraceCount % 2))
	for i, r := range recs[:min(len(recs), room)] {
		o := moeFusedTraceOffset/8 + i*moeFusedTraceWords
		w[o] = uint64(uint32(r.Task)) | uint64(r.Kind)<<32 | uint64(r.SM)<<40 | uint64(r.Block)<<48
		w[o+1], w[o+2], w[o+3], w[o+4], w[o+5] = r.Take, r.Ready, r.Start, r.End, r.Pos
	}
	return w
}

func TestMoETraceParseAndSummary(t *testing.T) {
	const T = 1_000_000 // ns
	recs := []MoETraceRec{
		// CTA 0 on SM 3: entry T, set-up T+1 µs, exit T+20 µs; a GEMM1 of 10 µs, a combine of 4 µs.
		{Kind: MoETraceCTA, Task: 0, SM: 3, Take: T, Start: T + 1000, End: T + 20000, Pos: 2},
		{Kind: MoETraceGEMM1, Task: 5, SM: 3, Take: T + 500, Ready: T + 1500, Start: T + 2000, End: T + 12000, Pos: 7<<32 | 2},
		{Kind: MoETraceCombine, Task: 9, SM: 3, Take: T + 11000, Ready: T + 13000, Start: T + 13000, End: T + 17000},
		// CTA 1, on the same SM (the mma.sync tiles' kernel runs several
		// an SM): entry T+2 µs, exit T+30 µs; split 1 of 2 of a GEMM2
		// block, 20 µs, overlapping CTA 0's tasks (not an overlap: another CTA).
		{Kind: MoETraceCTA, Task: 1, SM: 3, Block: 1, Take: T + 2000, Start: T + 3000, End: T + 30000, Pos: 1},
		{Kind: MoETraceGEMM2, Task: 6, SM: 3, Block: 1, Take: T + 2500, Ready: T + 2500, Start: T + 4000, End: T + 24000,
			Pos: 6<<32 | 1<<16 | 2<<24 | 5},
	}
	got, wanted, err := parseMoETrace(traceWords(8, len(recs), recs))
	if err != nil {
		t.Fatal(err)
	}
	if wanted != len(recs) || len(got) != len(recs) {
		t.Fatalf("parsed %d of %d records, want %d", len(got), wanted, len(recs))
	}
	for i := range recs {
		if got[i] != recs[i] {
			t.Fatalf("record %d: %+v, want %+v", i, got[i], recs[i])
		}
	}
	s, err := SummarizeMoETrace(got, wanted)
	if err != nil {
		t.Fatal(err)
	}
	near := func(name string, v, want float64) {
		t.Helper()
		if math.Abs(v-want) > 1e-9 {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
	if s.CTAs != 2 || s.Missing != 0 || s.Overlaps != 0 {
		t.Errorf("CTAs %d missing %d overlaps %d", s.CTAs, s.Missing, s.Overlaps)
	}
	near("span", s.SpanUS, 30)
	near("setup", s.SetupUS, 1)
	near("ramp", s.RampUS, 2)
	near("tail", s.TailUS, 0) // the median of two exits is the later one (index len/2)
	// idle: CTA 0 19 µs minus 14 busy, CTA 1 27 minus 20.
	near("idle", s.IdleUS, 5+7)
	if len(s.Kinds) != 3 {
		t.Fatalf("kinds %+v", s.Kinds)
	}
	g1, g2, cb := s.Kinds[0], s.Kinds[1], s.Kinds[2]
	if g1.Kind != "gemm1" || g2.Kind != "gemm2" || cb.Kind != "combine" {
		t.Fatalf("kinds %+v", s.Kinds)
	}
	near("gemm1 busy", g1.BusyUS, 10)
	near("gemm1 wait", g1.WaitUS, 1)
	near("gemm1 first", g1.FirstUS, 2)
	near("gemm2 last", g2.LastUS, 24)
	near("gemm2 share", g2.BusyShare, 20.0/60)
	near("combine wait", cb.WaitUS, 2)
	s.SetTaskFLOP("gemm1", 2*128*256*4096) // 268 MFLOP in 10 µs: 26.8 TFLOP/s
	if got := s.Kinds[0].TFLOPSPerSM; math.Abs(got-26.8435456) > 1e-6 {
		t.Errorf("gemm1 TFLOP/s an SM = %v", got)
	}
	if s.Kinds[1].TFLOPSPerSM != 0 {
		t.Errorf("gemm2 got a rate without its FLOP: %v", s.Kinds[1].TFLOPSPerSM)
	}
	if sp, n := got[4].Split(); sp != 1 || n != 2 {
		t.Errorf("gemm2 record: split %d of %d, want 1 of 2", sp, n)
	}
	if sp, n := got[1].Split(); sp != 0 || n != 1 {
		t.Errorf("gemm1 record: split %d of %d, want 0 of 1", sp, n)
	}
	if s.Splits != [2]int{1, 2} {
		t.Errorf("splits %v, want [1 2]", s.Splits)
	}
	s.SetTaskFLOP("gemm2", 2*16*64*4096) // half of 8.4 MFLOP (its split) in 20 µs: 0.21 TFLOP/s
	if got := s.Kinds[1].TFLOPSPerSM; math.Abs(got-0.2097152) > 1e-9 {
		t.Errorf("gemm2 TFLOP/s a CTA = %v", got)
	}
	// gemm2's one task (half of a 64 × 4096 bf16 block, 256 KB) from its
	// take at 2.5 µs to its end at 24 µs: 0.00610 TB/s.
	s.SetTaskBytes("gemm2", 2*64*4096)
	near("gemm2 take", s.Kinds[1].TakeUS, 2.5)
	near("gemm2 weight TB/s", s.Kinds[1].WeightTBps, 262144.0/21.5/1e6)
	if s.Kinds[0].WeightTBps != 0 {
		t.Errorf("gemm1 got a weight rate without its bytes: %v", s.Kinds[0].WeightTBps)
	}
	if !strings.Contains(s.String(), "gemm2") || !strings.Contains(s.String(), "TFLOP/s a CTA") ||
		!strings.Contains(s.String(), "k split 2") || !strings.Contains(s.String(), "weights 0.01 TB/s") {
		t.Errorf("String() lacks the kinds:\n%s", s)
	}
}

func TestMoETraceParseErrors(t *testing.T) {
	cta := MoETraceRec{Kind: MoETraceCTA, Take: 1, Start: 2, End: 3}
	for _, c := range []struct {
		name    string
		words   []uint64
		n       int
		wantErr bool
	}{
		{"no room", traceWords(0, 0, nil), 0, true},
		{"more wanted than room", traceWords(2, 5, []MoETraceRec{cta, cta, cta}), 2, false},
		{"bad kind", traceWords(1, 1, []MoETraceRec{{Kind: 9}}), 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			recs, _, err := parseMoETrace(c.words)
			if (err != nil) != c.wantErr || len(recs) != c.n {
				t.Fatalf("%d records, err %v; want %d, error %v", len(recs), err, c.n, c.wantErr)
			}
		})
	}
	if _, err := SummarizeMoETrace([]MoETraceRec{{Kind: MoETraceGEMM1}}, 1); err == nil {
		t.Error("a trace without CTA records summarised")
	}
}
