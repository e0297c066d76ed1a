package cuda

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/engine"
	"github.com/mkserve/mkserve/models"
)

// fastBackend is a new fast-profile backend (bf16 activations and KV) on
// the test GPU, with or without decode graphs.
func fastBackend(t *testing.T, graphs bool) *Backend {
	t.Helper()
	gpuBackend(t) // skips without a GPU
	off := false
	be, err := New(Options{SplitActivations: &off, NoGraphs: !graphs})
	if err != nil {
		t.Fatal(err)
	}
	return be
}

// argmaxRows is the argmax of every row of logits [rows, V].
func argmaxRows(v []float32, rows int) []int32 {
	V := len(v) / rows
	out := make([]int32, rows)
	for r := range rows {
		best := 0
		for j := 1; j < V; j++ {
			if v[r*V+j] > v[r*V+best] {
				best = j
			}
		}
		out[r] = int32(best)
	}
	return out
}

// graphRun runs steps of a model on be through backend.RunStep, as the
// engine does; sequence s owns blocks [s*perSeq, (s+1)*perSeq).
type graphRun struct {
	be     *Backend
	m      *models.Loaded
	bs     int
	perSeq int
}

func (r *graphRun) step(t *testing.T, b *backend.Batch) []float32 {
	t.Helper()
	out, err := backend.RunStep(r.be, b, func() (backend.Tensor, error) { return r.m.Model.Forward(b) })
	if err != nil {
		t.Fatal(err)
	}
	return r.be.ToHost(out)
}

func (r *graphRun) blocks(seq, n int) []int32 {
	v := make([]int32, (n+r.bs-1)/r.bs)
	for i := range v {
		v[i] = int32(seq*r.perSeq + i)
	}
	return v
}

// TestGraphDecodeMatchesEager: decode steps replayed from CUDA graphs give
// the logits of the same steps run eagerly, for families with GQA + q/k
// norms (qwen3_moe), sliding windows and sinks (gpt_oss) and MLA
// (deepseek_v3), over contexts that cross block boundaries and a key
// bucket (one prompt starts just below 256 keys, so the steps change key:
// warm-up, capture and replays again). Each step feeds new tokens, so a
// replay that ran nothing (stale logits) or read stale metadata fails.
// The garbage collector runs often, so that tensors of earlier steps die
// (and give their buffers back) in the middle of captures. Two graph
// backends run: one with fast replays (uploads refilled from the batch,
// no model code; every replay must be fast) and one whose replays run the
// model's Go code again.
func TestGraphDecodeMatchesEager(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(5))
	if !graphFastOn() {
		t.Logf("%s=0: the fast-replay backend replays slowly too", GraphFastEnv)
	}
	for _, fam := range []string{"qwen3_moe", "gpt_oss", "deepseek_v3"} {
		t.Run(fam, func(t *testing.T) {
			const bs, perSeq, steps = 4, 80, 12
			runs := make([]*graphRun, 3) // eager, graphs with fast replays, graphs with slow replays
			for i, graphs := range []bool{false, true, true} {
				be := fastBackend(t, graphs)
				be.slowReplays = i == 2
				if err := be.InitKV(bs, 3*perSeq); err != nil {
					t.Fatal(err)
				}
				runs[i] = &graphRun{be: be, m: loadModel(t, fam, be), bs: bs, perSeq: perSeq}
			}
			V := runs[0].m.Config.VocabSize
			prompts := [][]int32{{1, 5, 9, 13, 17}, {3, 4}, make([]int32, 250)}
			for i := range prompts[2] {
				prompts[2][i] = int32((i*37 + 11) % V)
			}
			next := make([]int32, len(prompts))
			for s, p := range prompts {
				for i, r := range runs {
					b := backend.SingleSequence(uint64(s), p, 0, false)
					b.Seqs[0].Blocks = r.blocks(s, len(p))
					b.LogitRows = []int{len(p) - 1}
					v := r.step(t, b)
					if i == 0 {
						next[s] = argmaxRows(v, 1)[0]
					}
				}
			}
			past := []int{len(prompts[0]), len(prompts[1]), len(prompts[2])}
			worst := 0.0
			for st := range steps {
				var got [3][]float32
				for i, r := range runs {
					b := &backend.Batch{}
					for s := range prompts {
						b.Tokens = append(b.Tokens, next[s])
						b.Positions = append(b.Positions, int32(past[s]))
						b.Seqs = append(b.Seqs, backend.SeqSpan{ID: uint64(s), Offset: s, Len: 1, Past: past[s],
							Blocks: r.blocks(s, past[s]+1)})
					}
					got[i] = r.step(t, b)
				}
				for i, name := range []string{"", "fast-replay", "slow-replay"} {
					if i == 0 {
						continue
					}
					e := relL2(got[i], got[0])
					worst = max(worst, e)
					if !(e <= 1e-3) {
						t.Errorf("step %d (contexts %v): %s graph logits relative L2 %.3g to eager", st, past, name, e)
					}
				}
				next = argmaxRows(got[0], len(prompts))
				for s := range past {
					past[s]++
				}
			}
			for i, r := range runs[1:] {
				gs := r.be.Graphs()
				t.Logf("GRAPHS %s: %d decode steps, worst relative L2 to eager %.3g; stats %+v", fam, steps, worst, gs)
				if gs.Failed != 0 || gs.Diverged != 0 || gs.Captures != 2 || gs.Replays != steps-4 {
					t.Errorf("stats %+v: want 2 captures (one per key bucket), %d replays, no failures", gs, steps-4)
				}
				wantFast := int64(0)
				if i == 0 && graphFastOn() {
					wantFast = gs.Replays
				}
				if gs.FastReplays != wantFast {
					t.Errorf("%d fast replays of %d, want %d (last error %q)", gs.FastReplays, gs.Replays, wantFast, gs.LastError)
				}
			}
			if s := runs[0].be.Graphs(); s.Captures != 0 || s.Replays != 0 {
				t.Errorf("NoGraphs backend captured: %+v", s)
			}
		})
	}
}

// TestGraphDiverges: a step whose Go code does something its capture did
// not (here one more op) is not replayed: the graph is dropped, the step
// runs eagerly with the right result, and the next steps capture again.
// Only a regular replay runs the step's Go code and can see this; a fast
// replay does not run it (GraphStep's f must be the model's forward pass
// and nothing else), so the backend here replays slowly.
func TestGraphDiverges(t *testing.T) {
	be := fastBackend(t, true)
	be.slowReplays = true
	const bs = 4
	if err := be.InitKV(bs, 64); err != nil {
		t.Fatal(err)
	}
	r := &graphRun{be: be, m: loadModel(t, "qwen3_moe", be), bs: bs, perSeq: 16}
	decode := func(pos int, tok int32) *backend.Batch {
		return &backend.Batch{Tokens: []int32{tok}, Positions: []int32{int32(pos)},
			Seqs: []backend.SeqSpan{{ID: 0, Len: 1, Past: pos, Blocks: r.blocks(0, pos+1)}}}
	}
	pre := backend.SingleSequence(0, []int32{1, 2, 3}, 0, false)
	pre.Seqs[0].Blocks = r.blocks(0, 3)
	r.step(t, pre)
	for pos := 3; pos < 6; pos++ { // eager, capture, replay
		r.step(t, decode(pos, int32(pos)))
	}
	before := be.Graphs()
	if before.Captures != 1 || before.Replays != 1 || before.TapeBytes == 0 {
		t.Fatalf("before: %+v", before)
	}
	b := decode(6, 7)
	var plain backend.Tensor
	out, err := be.GraphStep(b, func() (backend.Tensor, error) {
		x, err := r.m.Model.Forward(b)
		if err != nil {
			return nil, err
		}
		plain = x
		return be.Add(x, x), nil // not in the capture
	})
	if err != nil {
		t.Fatal(err)
	}
	got, base := be.ToHost(out), be.ToHost(plain)
	for i := range base {
		base[i] *= 2
	}
	if e := relL2(got, base); !(e <= 1e-6) {
		t.Errorf("diverged step's result relative L2 %.3g to 2·logits", e)
	}
	gs := be.Graphs()
	if gs.Diverged != 1 || gs.Live != 0 || gs.LastError == "" {
		t.Errorf("after divergence: %+v", gs)
	}
	t.Logf("diverged as expected: %s", gs.LastError)
	for pos := 7; pos < 10; pos++ { // the key is captured again
		r.step(t, decode(pos, int32(pos)))
	}
	// The new capture of the same shape takes all its memory from the
	// arena the first one left.
	if gs := be.Graphs(); gs.Captures < 2 || gs.Live != 1 || gs.TapeBytes != before.TapeBytes {
		t.Errorf("after recapture: %+v, arena before %d bytes", gs, before.TapeBytes)
	}
}

// TestEngineGraphs: the serving engine on a fast-profile backend with decode
// graphs gives concurrent greedy requests the tokens engine.Greedy gives
// eagerly, and its decode steps ran as graphs.
func TestEngineGraphs(t *testing.T) {
	for _, sync := range []bool{false, true} {
		t.Run(fmt.Sprintf("sync=%v", sync), func(t *testing.T) {
			be := fastBackend(t, true)
			st := engineMatchesGreedy(t, be, func(c *engine.Config) { c.SyncSteps = sync })
			gs := be.Graphs()
			t.Logf("engine graph stats: %+v; overlapped steps %d", gs, st.OverlappedSteps)
			if gs.Replays == 0 || gs.FastReplays == 0 || gs.Failed != 0 || gs.Diverged != 0 {
				t.Errorf("stats %+v: want fast replays and no failures", gs)
			}
			// Overlapped decode: steps launched with the previous step's
			// tokens on the device, which the graphs' Embed reads there.
			if (st.OverlappedSteps == 0) != sync {
				t.Errorf("%d overlapped steps with SyncSteps %v", st.OverlappedSteps, sync)
			}
		})
	}
}

// TestEngineGraphWarmup: with engine.Config.GraphWarmup the engine captures
// the graphs of 1, 2, 4 and 8 rows (MaxNumSeqs 8) before serving, its decode
// steps then only replay them, and the greedy tokens are engine.Greedy's.
func TestEngineGraphWarmup(t *testing.T) {
	be := fastBackend(t, true)
	engineMatchesGreedy(t, be, func(c *engine.Config) { c.GraphWarmup = true })
	gs := be.Graphs()
	t.Logf("engine graph stats after warm-up and serving: %+v", gs)
	if gs.Captures != 4 || gs.Live != 4 || gs.Replays == 0 || gs.Failed != 0 || gs.Diverged != 0 {
		t.Errorf("stats %+v: want the 4 warm-up captures only, replays while serving, no failures", gs)
	}
}

// TestGraphPadding: decode batches of 5 to 8 rows share the graph of 8 rows
// (padded with rows that store nothing: sequence 0 owns block 0, which the
// padding rows read, and its later steps would show a write), and give the
// eager logits of their real rows.
func TestGraphPadding(t *testing.T) {
	const bs, perSeq, nseq = 4, 16, 8
	runs := make([]*graphRun, 2)
	for i, graphs := range []bool{false, true} {
		be := fastBackend(t, graphs)
		if err := be.InitKV(bs, nseq*perSeq); err != nil {
			t.Fatal(err)
		}
		runs[i] = &graphRun{be: be, m: loadModel(t, "qwen3_moe", be), bs: bs, perSeq: perSeq}
	}
	V := runs[0].m.Config.VocabSize
	past := make([]int, nseq)
	next := make([]int32, nseq)
	for s := range nseq {
		p := []int32{int32(s + 1), int32(2*s + 3), 7}
		for _, r := range runs {
			b := backend.SingleSequence(uint64(s), p, 0, false)
			b.Seqs[0].Blocks = r.blocks(s, len(p))
			b.LogitRows = []int{len(p) - 1}
			next[s] = argmaxRows(r.step(t, b), 1)[0]
		}
		past[s] = len(p)
	}
	for st, T := range []int{5, 8, 6, 7, 5, 8, 6, 7, 8, 5} {
		var got [2][]float32
		for i, r := range runs {
			b := &backend.Batch{LogitRows: make([]int, T)}
			for s := range T {
				b.Tokens = append(b.Tokens, next[s])
				b.Positions = append(b.Positions, int32(past[s]))
				b.Seqs = append(b.Seqs, backend.SeqSpan{ID: uint64(s), Offset: s, Len: 1, Past: past[s], Blocks: r.blocks(s, past[s]+1)})
				b.LogitRows[s] = s
			}
			got[i] = r.step(t, b)
			if len(got[i]) != T*V || len(b.Tokens) != T || len(b.Seqs) != T || len(b.LogitRows) != T {
				t.Fatalf("step %d: %d logits for %d rows of %d, batch left with %d tokens", st, len(got[i]), T, V, len(b.Tokens))
			}
		}
		if e := relL2(got[1], got[0]); !(e <= 1e-3) {
			t.Errorf("step %d (%d rows): graph logits relative L2 %.3g to eager", st, T, e)
		}
		ids := argmaxRows(got[0], T)
		for s := range T {
			next[s] = ids[s]
			past[s]++
		}
	}
	gs := runs[1].be.Graphs()
	t.Logf("GRAPHS padding: %+v", gs)
	if gs.Captures != 1 || gs.Diverged != 0 || gs.Failed != 0 || gs.Replays != 8 {
		t.Errorf("stats %+v: want one graph of 8 rows captured once and replayed 8 times", gs)
	}
}

// TestGraphStepsLeakNothing: rounds of an eager prefill and decode steps
// (captured, then replayed, with padding) hold no more allocator buffers
// once their tensors are dead than the rounds before: tensors made in a
// replay register no cleanup (their buffers are the arena's), and a buffer
// attached to one later from the pool must still come back.
func TestGraphStepsLeakNothing(t *testing.T) {
	const bs, perSeq = 4, 64
	be := fastBackend(t, true)
	if err := be.InitKV(bs, 4*perSeq); err != nil {
		t.Fatal(err)
	}
	r := &graphRun{be: be, m: loadModel(t, "qwen3_moe", be), bs: bs, perSeq: perSeq}
	// settled is the allocator's buffers outside pool and arena once the
	// garbage collector has run the dead tensors' cleanups (it waits for
	// two equal readings).
	settled := func() int64 {
		last := int64(-1)
		for range 100 {
			runtime.GC()
			time.Sleep(5 * time.Millisecond)
			n := be.alloc.outside()
			if n == last {
				return n
			}
			last = n
		}
		return last
	}
	var seen []int64
	for round := range 6 {
		seq := round % 3
		prompt := []int32{int32(3 + round), 9, 13, 17, 21}
		b := backend.SingleSequence(uint64(seq), prompt, 0, false)
		b.Seqs[0].Blocks = r.blocks(seq, len(prompt))
		b.LogitRows = []int{len(prompt) - 1}
		next := argmaxRows(r.step(t, b), 1)[0]
		for st := range 4 {
			past := len(prompt) + st
			d := &backend.Batch{Tokens: []int32{next, 7, 11}, Positions: []int32{int32(past), 3, 4}}
			for i, s := range []int{seq, 3, 3} { // rows 2 and 3 of one more sequence: 3 rows pad to 4
				p := past
				if i > 0 {
					p = 3 + i - 1
				}
				d.Seqs = append(d.Seqs, backend.SeqSpan{ID: uint64(s*10 + i), Offset: i, Len: 1, Past: p, Blocks: r.blocks(s, p+1)})
			}
			next = argmaxRows(r.step(t, d), 3)[0]
		}
		seen = append(seen, settled())
	}
	gs := be.Graphs()
	t.Logf("buffers outside pool and arena after each round: %v; graphs %+v", seen, gs)
	if gs.Replays == 0 {
		t.Fatalf("no replays: %+v", gs)
	}
	if err := checkLarge(be.alloc); err != nil {
		t.Error(err)
	}
	if seen[len(seen)-1] > seen[2] {
		t.Errorf("buffers held after rounds 3..6 grew: %v (a leak)", seen)
	}
}

// stampedSteps runs the engine's greedy requests on graph steps (stamps
// switched on by the caller), checks their tokens and graph counters, and
// returns the last step's stamps.
func stampedSteps(t *testing.T) []OpStamp {
	t.Helper()
	be := fastBackend(t, true)
	engineMatchesGreedy(t, be, func(c *engine.Config) { c.SyncSteps = true })
	if gs := be.Graphs(); gs.FastReplays == 0 || gs.Failed != 0 || gs.Diverged != 0 {
		t.Fatalf("stats %+v: want fast replays and no failures", gs)
	}
	st, err := be.StepStamps()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestStepStamps: with clock stamps after every op (forced on), the
// engine's graph steps still give engine.Greedy's tokens, and StepStamps
// returns the last step's ops in order with their times.
func TestStepStamps(t *testing.T) {
	defer func(s func() bool) { stampsOn = s }(stampsOn)
	stampsOn = func() bool { return true }
	st := stampedSteps(t)
	var total int64
	seen := map[string]int{}
	for _, o := range st {
		if o.NS < 0 || o.NS > 1e9 {
			t.Errorf("op %q took %d ns", o.Op, o.NS)
		}
		total += o.NS
		seen[o.Op]++
	}
	t.Logf("%d stamped ops, %.1f µs; by op: %v", len(st), float64(total)/1e3, seen)
	if total <= 0 || seen["Attention"] == 0 || seen["Embed"] == 0 {
		t.Errorf("stamps %v: want a positive total and the embedding and attention ops", st)
	}
}

// TestStepKernelStamps: with clock stamps after every kernel (forced on),
// the engine's graph steps still give engine.Greedy's tokens, and
// StepStamps names the last step's kernels (the decode kernels launched
// through the library's programmatic path) in order with their times.
func TestStepKernelStamps(t *testing.T) {
	defer func(s, k func() bool) { stampsOn, kernelStamps = s, k }(stampsOn, kernelStamps)
	stampsOn = func() bool { return true }
	kernelStamps = func() bool { return true }
	st := stampedSteps(t)
	var total int64
	norms := 0
	for _, o := range st {
		if o.NS < 0 || o.NS > 1e9 || o.Op == "" || o.Op == "start" {
			t.Errorf("stamp %+v", o)
		}
		total += o.NS
		if strings.Contains(o.Op, "rmsnorm") {
			norms++
		}
	}
	t.Logf("%d kernels stamped, %.1f µs", len(st), float64(total)/1e3)
	if len(st) < 5 || total <= 0 || norms == 0 {
		t.Errorf("stamps %v: want the step's kernels, the RMSNorms among them", st)
	}
}

// TestEngineSpeculation: prompt-lookup speculation on the CUDA backend —
// verify steps as one-token spans sharing a block table, run by the
// separate decode kernels (each span sees the KV the step writes for the
// tokens before it), eagerly and as graphs of their own key — gives
// engine.Greedy's tokens.
func TestEngineSpeculation(t *testing.T) {
	for _, graphs := range []bool{false, true} {
		t.Run(fmt.Sprintf("graphs=%v", graphs), func(t *testing.T) {
			be := fastBackend(t, graphs)
			st := engineMatchesGreedy(t, be, func(c *engine.Config) { c.SpeculativeTokens = 4; c.SpeculativeNgramMin = 1 })
			gs := be.Graphs()
			t.Logf("drafted %d, accepted %d; graph stats %+v", st.SpecDrafted, st.SpecAccepted, gs)
			if st.SpecDrafted == 0 {
				t.Error("no drafts were verified")
			}
			if graphs && (gs.Replays == 0 || gs.Failed != 0 || gs.Diverged != 0) {
				t.Errorf("graph stats %+v: want replays and no failures", gs)
			}
		})
	}
}
