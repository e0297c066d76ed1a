package kernels

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
)

// The fused MoE kernel's task trace (mk_moe_fused.h, MK_MOE_FUSED_TRACE_*):
// a diagnostic that records, per task of one persistent launch (either
// kernel: the wgmma tiles' or the mma.sync tiles'), when its CTA took it,
// when its inputs were there, and when its compute started and finished.
// In the mma.sync tiles' kernel every thread takes every role: a task
// starts when its input wait ends. Off unless the control workspace
// was made by NewMoEFusedTracedControl.

// Layout of the trace in the control workspace (mk_moe_fused.h).
const (
	moeFusedTraceCap    = 8   // int32 word: the room in records (0: off)
	moeFusedTraceCount  = 18  // int32 word: the records the last launch wanted to write
	moeFusedTraceOffset = 256 // bytes: the first record
	moeFusedTraceWords  = 6   // uint64 words a record
)

// MoETraceKind is what a trace record describes.
type MoETraceKind int

// The kinds of trace records.
const (
	MoETraceCTA      MoETraceKind = iota // one CTA: entry, set-up done, exit
	MoETraceGEMM1                        // a GEMM1 task (row tile × column block, SwiGLU epilogue)
	MoETraceGEMM2                        // a GEMM2 task
	MoETraceCombine                      // a combine task
	MoETraceDispatch                     // a dispatch task
	moeTraceKinds
)

func (k MoETraceKind) String() string {
	switch k {
	case MoETraceCTA:
		return "cta"
	case MoETraceGEMM1:
		return "gemm1"
	case MoETraceGEMM2:
		return "gemm2"
	case MoETraceCombine:
		return "combine"
	case MoETraceDispatch:
		return "dispatch"
	}
	return fmt.Sprintf("kind%d", int(k))
}

// MoETraceRec is one record (times in ns of the GPU's global timer).
type MoETraceRec struct {
	Kind  MoETraceKind
	Task  int    // the task's index in its queue; a CTA record: the block
	SM    int    // the multiprocessor that ran it
	Block int    // the CTA that ran it
	Take  uint64 // the producer took the task (CTA: kernel entry)
	Ready uint64 // its inputs were there (the producer's wait ended)
	Start uint64 // the consumers started it (CTA: set-up done)
	End   uint64 // they finished it, signals included (CTA: exit)
	Pos   uint64 // GEMM: row tile << 32 | split << 16 | splits << 24 | column block (splits 0: unsplit); combine, dispatch: first token; CTA: its tasks
}

// Split is a GEMM record's split of its block's reduction and the splits
// of that block (0, 1 when the reduction is not split).
func (r MoETraceRec) Split() (split, splits int) {
	if n := int(r.Pos >> 24 & 0xff); n > 1 {
		return int(r.Pos >> 16 & 0xff), n
	}
	return 0, 1
}

// NewMoEFusedTracedControl is NewMoEFusedControl with room for a trace of
// up to records tasks of each launch on it (read by MoEFusedTrace).
func (d *Device) NewMoEFusedTracedControl(bytes int64, records int) (*Buffer, error) {
	if records < 1 || records > 1<<24 {
		return nil, fmt.Errorf("kernels: NewMoEFusedTracedControl: %d records, want 1..%d", records, 1<<24)
	}
	total := max(bytes, moeFusedTraceOffset) + int64(records)*moeFusedTraceWords*8
	b, err := d.Malloc(total)
	if err != nil {
		return nil, err
	}
	words := make([]int32, total/4)
	words[moeFusedTraceCap] = int32(records)
	if err := Upload(d, b, words); err != nil {
		b.Free()
		return nil, err
	}
	return b, nil
}

// MoEFusedTrace waits for the device and reads the trace of the last
// launch on ctl: its records, and how many the launch wanted to write
// (more than returned when the room was too small). The persistent
// kernels trace; the separate path's launches leave no records.
func (d *Device) MoEFusedTrace(ctl *Buffer) ([]MoETraceRec, int, error) {
	const op = "MoEFusedTrace"
	if err := d.ready(op); err != nil {
		return nil, 0, err
	}
	if err := ctl.fits(op+" control workspace", moeFusedTraceOffset); err != nil {
		return nil, 0, err
	}
	words := make([]uint64, ctl.bytes/8)
	if err := Download(d, words, ctl); err != nil {
		return nil, 0, err
	}
	return parseMoETrace(words)
}

// parseMoETrace reads the trace out of a control workspace's uint64 words.
func parseMoETrace(words []uint64) ([]MoETraceRec, int, error) {
	word32 := func(i int) int32 { return int32(uint32(words[i/2] >> (32 * (i % 2)))) }
	room, wanted := int(word32(moeFusedTraceCap)), int(word32(moeFusedTraceCount))
	if room <= 0 {
		return nil, 0, fmt.Errorf("kernels: MoEFusedTrace: the control workspace has no trace room (NewMoEFusedTracedControl)")
	}
	fit := (len(words) - moeFusedTraceOffset/8) / moeFusedTraceWords
	n := min(wanted, room, fit)
	recs := make([]MoETraceRec, 0, max(n, 0))
	for i := range max(n, 0) {
		w := words[moeFusedTraceOffset/8+i*moeFusedTraceWords:]
		r := MoETraceRec{Kind: MoETraceKind(w[0] >> 32 & 0xff), Task: int(int32(uint32(w[0]))), SM: int(w[0] >> 40 & 0xff),
			Block: int(w[0] >> 48), Take: w[1], Ready: w[2], Start: w[3], End: w[4], Pos: w[5]}
		if r.Kind >= moeTraceKinds {
			return nil, wanted, fmt.Errorf("kernels: MoEFusedTrace: record %d has kind %d", i, r.Kind)
		}
		recs = append(recs, r)
	}
	return recs, wanted, nil
}

// MoETraceKindStats sums one kind of task over a launch (µs).
type MoETraceKindStats struct {
	Kind      string  `json:"kind"`
	Tasks     int     `json:"tasks"`
	BusyUS    float64 `json:"busy_us"`    // Σ (end − start): the consumers' time on these tasks, all CTAs
	MeanUS    float64 `json:"mean_us"`    // per task
	P90US     float64 `json:"p90_us"`     // per task, 90th percentile
	WaitUS    float64 `json:"wait_us"`    // Σ (ready − take): the producers' waits for the tasks' inputs
	FirstUS   float64 `json:"first_us"`   // the first start, from the launch's first entry
	TakeUS    float64 `json:"take_us"`    // the first take, from the launch's first entry
	LastUS    float64 `json:"last_us"`    // the last end, from the launch's first entry
	BusyShare float64 `json:"busy_share"` // BusyUS ÷ (CTAs × launch span)
	// TFLOPSPerSM is a GEMM task's rate on its CTA (SetTaskFLOP: the
	// tile's FLOP, padding rows included, over its splits, over the mean
	// task time); several CTAs may share a multiprocessor.
	TFLOPSPerSM float64 `json:"tflops_per_sm,omitempty"`
	// WeightTBps is the kind's weight bytes (SetTaskBytes: one block's
	// weights, each task its split's share) over its phase, first take to
	// last end: at one row tile an expert (decode sizes) the rate the
	// weights were read at; with several row tiles an expert it counts a
	// block's weights once a tile (L2 hits included).
	WeightTBps float64 `json:"weight_tbps,omitempty"`
	splits     int     // GEMM: the splits of a block's reduction (1: none)
}

// MoETraceSummary is where one traced launch's time went.
type MoETraceSummary struct {
	CTAs     int                 `json:"ctas"`
	SpanUS   float64             `json:"span_us"`  // first CTA entry to last CTA exit
	SetupUS  float64             `json:"setup_us"` // mean entry → set-up done
	RampUS   float64             `json:"ramp_us"`  // last CTA entry − first (the launch's ramp)
	TailUS   float64             `json:"tail_us"`  // last exit − median exit
	IdleUS   float64             `json:"idle_us"`  // Σ over CTAs of set-up done → exit not inside a task
	Kinds    []MoETraceKindStats `json:"kinds"`    // GEMM1, GEMM2, combine, dispatch (those present)
	Missing  int                 `json:"missing"`  // records the room could not hold
	Overlaps int                 `json:"overlaps"` // tasks of one CTA that overlap (a clock or trace error)
	Splits   [2]int              `json:"splits"`   // GEMM1's and GEMM2's splits of a block's reduction (1: none)
}

// SummarizeMoETrace sums a launch's records; wanted is the count the
// launch reported (MoEFusedTrace's second result).
func SummarizeMoETrace(recs []MoETraceRec, wanted int) (MoETraceSummary, error) {
	var s MoETraceSummary
	s.Missing = max(wanted-len(recs), 0)
	var entries, exits []uint64
	setup := 0.0
	for _, r := range recs {
		if r.Kind == MoETraceCTA {
			entries = append(entries, r.Take)
			exits = append(exits, r.End)
			setup += float64(r.Start-r.Take) / 1e3
		}
	}
	if len(entries) == 0 {
		return s, fmt.Errorf("kernels: SummarizeMoETrace: no CTA records (%d records)", len(recs))
	}
	slices.Sort(entries)
	slices.Sort(exits)
	t0, t1 := entries[0], exits[len(exits)-1]
	if t1 < t0 {
		return s, fmt.Errorf("kernels: SummarizeMoETrace: last exit before first entry")
	}
	us := func(a, b uint64) float64 {
		if b < a {
			return -float64(a-b) / 1e3
		}
		return float64(b-a) / 1e3
	}
	s.CTAs = len(entries)
	s.SpanUS = us(t0, t1)
	s.SetupUS = setup / float64(s.CTAs)
	s.RampUS = us(t0, entries[len(entries)-1])
	s.TailUS = us(exits[len(exits)/2], t1)
	type acc struct {
		durs              []float64
		wait              float64
		first, last, take uint64
		seen              bool
		splits            int
	}
	var by [moeTraceKinds]acc
	perCTA := map[int][]MoETraceRec{}
	busyCTA := map[int]float64{}
	for _, r := range recs {
		if r.Kind == MoETraceCTA {
			continue
		}
		a := &by[r.Kind]
		a.durs = append(a.durs, us(r.Start, r.End))
		a.wait += us(r.Take, r.Ready)
		if !a.seen || r.Start < a.first {
			a.first = r.Start
		}
		if !a.seen || r.Take < a.take {
			a.take = r.Take
		}
		if !a.seen || r.End > a.last {
			a.last = r.End
		}
		a.seen = true
		if _, n := r.Split(); n > a.splits {
			a.splits = n
		}
		perCTA[r.Block] = append(perCTA[r.Block], r)
		busyCTA[r.Block] += us(r.Start, r.End)
	}
	for _, rs := range perCTA {
		slices.SortFunc(rs, func(a, b MoETraceRec) int { return cmp.Compare(a.Start, b.Start) })
		for i := 1; i < len(rs); i++ {
			if rs[i].Start < rs[i-1].End {
				s.Overlaps++
			}
		}
	}
	for _, r := range recs {
		if r.Kind == MoETraceCTA {
			s.IdleUS += us(r.Start, r.End) - busyCTA[r.Block]
		}
	}
	for k := MoETraceGEMM1; k < moeTraceKinds; k++ {
		a := &by[k]
		if !a.seen {
			continue
		}
		slices.Sort(a.durs)
		sum := 0.0
		for _, v := range a.durs {
			sum += v
		}
		st := MoETraceKindStats{Kind: k.String(), Tasks: len(a.durs), BusyUS: sum, MeanUS: sum / float64(len(a.durs)),
			P90US: a.durs[min(len(a.durs)-1, int(math.Ceil(0.9*float64(len(a.durs))))-1)], WaitUS: a.wait,
			FirstUS: us(t0, a.first), TakeUS: us(t0, a.take), LastUS: us(t0, a.last)}
		if s.SpanUS > 0 {
			st.BusyShare = sum / (float64(s.CTAs) * s.SpanUS)
		}
		st.splits = max(a.splits, 1)
		if k == MoETraceGEMM1 || k == MoETraceGEMM2 {
			s.Splits[k-MoETraceGEMM1] = st.splits
		}
		s.Kinds = append(s.Kinds, st)
	}
	return s, nil
}

// SetTaskFLOP sets the TFLOP/s a CTA of kind's tasks ("gemm1", "gemm2")
// from the FLOP of one unsplit block (2 · tile rows · tile columns · k):
// a split task does its share.
func (s *MoETraceSummary) SetTaskFLOP(kind string, flop float64) {
	for i := range s.Kinds {
		if k := &s.Kinds[i]; k.Kind == kind && k.MeanUS > 0 {
			k.TFLOPSPerSM = flop / float64(max(k.splits, 1)) / k.MeanUS / 1e6
		}
	}
}

// SetTaskBytes sets kind's WeightTBps from the weight bytes of one
// unsplit block (tile columns × k × 2 for bf16): a split task reads its
// share.
func (s *MoETraceSummary) SetTaskBytes(kind string, bytes float64) {
	for i := range s.Kinds {
		if k := &s.Kinds[i]; k.Kind == kind && k.LastUS > k.TakeUS {
			k.WeightTBps = float64(k.Tasks) * bytes / float64(max(k.splits, 1)) / (k.LastUS - k.TakeUS) / 1e6
		}
	}
}

// String renders the summary as a few lines of text.
func (s MoETraceSummary) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "trace: %d CTAs, span %.1f µs (set-up %.1f, ramp %.1f, tail %.1f), idle %.1f%% of CTA time",
		s.CTAs, s.SpanUS, s.SetupUS, s.RampUS, s.TailUS, 100*s.IdleUS/math.Max(float64(s.CTAs)*s.SpanUS, 1e-9))
	if s.Missing > 0 {
		fmt.Fprintf(&b, ", %d records missing", s.Missing)
	}
	if s.Overlaps > 0 {
		fmt.Fprintf(&b, ", %d overlapping", s.Overlaps)
	}
	b.WriteString("\n")
	for _, k := range s.Kinds {
		fmt.Fprintf(&b, "  %-8s %6d tasks, busy %5.1f%%, mean %7.2f µs, p90 %7.2f, input wait %9.1f µs, from %8.1f to %8.1f µs",
			k.Kind, k.Tasks, 100*k.BusyShare, k.MeanUS, k.P90US, k.WaitUS, k.FirstUS, k.LastUS)
		if k.splits > 1 {
			fmt.Fprintf(&b, ", k split %d", k.splits)
		}
		if k.TFLOPSPerSM > 0 {
			fmt.Fprintf(&b, ", %.2f TFLOP/s a CTA (%.0f over %d)", k.TFLOPSPerSM, k.TFLOPSPerSM*float64(s.CTAs), s.CTAs)
		}
		if k.WeightTBps > 0 {
			fmt.Fprintf(&b, ", weights %.2f TB/s over %.1f–%.1f µs", k.WeightTBps, k.TakeUS, k.LastUS)
		}
		b.WriteString("\n")
	}
	return b.String()
}
