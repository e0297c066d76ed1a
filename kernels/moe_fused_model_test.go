package kernels

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A goroutine model of moe_fused.cu's protocol (no GPU): the plan, the two
// queues, the task index mapping through per-rank prefix sums, the counter
// targets (arrive == rows of the tile, g1done == GEMM1 blocks, tokdone ==
// GEMM2 blocks × routed k) and the bounded waits, with goroutines as CTAs
// (fewer than the tasks, some starting on dispatch). Rows carry scalars:
// GEMM1 block n of a row writes act = recv·(slot+1) + n, GEMM2 block m
// writes Σ_n act + m to the returned row, the combine sums w·ret in k order;
// a task that ran before what it waited on would read NaN and fail.
// Two CTA shapes: cta is fused_kernel's (every thread takes every role, one
// task at a time), ctaWG is fused_wg_kernel's (a producer goroutine takes
// the main queue and waits for a GEMM task's inputs, handing tasks through
// a two-slot ring to the consumer goroutine, which dispatches first, then
// computes and combines; a failed wait drains both to the end). GEMM tasks
// map to tiles through task_tile's grouped rasterisation (group row tiles).
// fold is Params.fold: no combine tasks; a token's counter per GEMM2
// column block starts at −(its routed k) and the GEMM2 task whose row
// brings it to 0 sums that column of the token (fold_combine).

type modelRank struct {
	T, S                    int
	x                       []float64 // [T]
	ids                     []int32   // [T*K]
	w                       []float64
	numTiles                int
	tileSlot, tileWant      []int
	arrive, g1done, tokdone []atomic.Int32
	rowSrc                  []int // a*8 + r or -1
	recv                    []float64
	act                     [][]float64 // [rows][n1]
	destRow                 []int
	ret                     [][]float64 // [T*K][n2]
	out                     [][]float64 // [T][n2]
	// split reductions: per GEMM, the splits done per (tile, block) and
	// each split's partial per row, [(tile·n + block)·ks + split][BM]
	kdone [2][]atomic.Int32
	part  [2][][]float64
}

type fusedModel struct {
	R, K, E, BM, n1, n2, DT, CT int
	group                       int // task_tile's rasterisation group (row tiles)
	ks1, ks2                    int // splits of GEMM1's and GEMM2's reductions (Params.ks1, ks2)
	nc                          int // combine tasks per block of CT tokens (Params.comb_nc), each ceil(n2/nc) columns
	fold                        bool
	place                       []int32
	rk                          []*modelRank
	qDisp, qMain                atomic.Int32
	errSet                      atomic.Int32
	timeout                     time.Duration
	faultRank                   int
}

func (m *fusedModel) plan() {
	for _, r := range m.rk {
		r.destRow = make([]int, r.T*m.K)
		for i := range r.destRow {
			r.destRow[i] = -1
		}
		r.tokdone = make([]atomic.Int32, r.T)
	}
	for b, me := range m.rk {
		cnt := make([]int, me.S)
		for r, src := range m.rk {
			for _, e := range src.ids {
				if p := m.place[r*m.E+int(e)]; int(p>>16) == b {
					cnt[p&0xffff]++
				}
			}
		}
		off := make([]int, me.S+1)
		for s := range me.S {
			off[s+1] = off[s] + (cnt[s]+m.BM-1)/m.BM*m.BM
		}
		me.numTiles = off[me.S] / m.BM
		rows := off[me.S]
		me.tileSlot, me.tileWant = make([]int, me.numTiles), make([]int, me.numTiles)
		me.arrive, me.g1done = make([]atomic.Int32, me.numTiles), make([]atomic.Int32, me.numTiles)
		for g, n := range [2][2]int{{m.n1, m.ks1}, {m.n2, m.ks2}} {
			me.kdone[g] = make([]atomic.Int32, me.numTiles*n[0])
			me.part[g] = make([][]float64, me.numTiles*n[0]*n[1])
			for i := range me.part[g] {
				me.part[g][i] = make([]float64, m.BM)
			}
		}
		me.rowSrc, me.recv, me.act = make([]int, rows), make([]float64, rows), make([][]float64, rows)
		for i := range rows {
			me.rowSrc[i], me.recv[i] = -1, math.NaN()
			me.act[i] = make([]float64, m.n1)
			for j := range me.act[i] {
				me.act[i][j] = math.NaN()
			}
		}
		for s := range me.S {
			for tl := off[s] / m.BM; tl < off[s+1]/m.BM; tl++ {
				me.tileSlot[tl], me.tileWant[tl] = s, min(m.BM, cnt[s]-(tl*m.BM-off[s]))
			}
		}
		cur := make([]int, me.S)
		for r, src := range m.rk {
			for a, e := range src.ids {
				if p := m.place[r*m.E+int(e)]; int(p>>16) == b {
					s := int(p & 0xffff)
					q := off[s] + cur[s]
					cur[s]++
					me.rowSrc[q] = a*8 + r
					src.destRow[a] = q*8 + b
				}
			}
		}
	}
	if m.fold { // the counters from −routed; a token with none: its output (0) from the plan
		for _, r := range m.rk {
			r.tokdone = make([]atomic.Int32, r.T*m.n2)
		}
	}
	for _, r := range m.rk {
		r.ret, r.out = make([][]float64, r.T*m.K), make([][]float64, r.T)
		for i := range r.ret {
			r.ret[i] = make([]float64, m.n2)
			for j := range r.ret[i] {
				r.ret[i][j] = math.NaN()
			}
		}
		for t := range r.out {
			r.out[t] = make([]float64, m.n2)
			for j := range r.out[t] {
				r.out[t][j] = math.NaN() // every column must be written by its combine task
			}
			if m.fold {
				routed := 0
				for k := range m.K {
					if r.destRow[t*m.K+k] >= 0 {
						routed++
					}
				}
				for j := range m.n2 {
					r.tokdone[t*m.n2+j].Store(int32(-routed))
					if routed == 0 {
						r.out[t][j] = 0
					}
				}
			}
		}
	}
}

// wait spins until c ≥ want, another waiter gave up, or the timeout.
func (m *fusedModel) wait(c *atomic.Int32, want int) bool {
	t0 := time.Now()
	for c.Load() < int32(want) {
		if m.errSet.Load() != 0 {
			return false
		}
		if time.Since(t0) > m.timeout {
			m.errSet.Store(1)
			return false
		}
		time.Sleep(time.Microsecond)
	}
	return true
}

func prefix(n []int) []int {
	p := make([]int, len(n)+1)
	for i, v := range n {
		p[i+1] = p[i] + v
	}
	return p
}

// taskTile is moe_fused.cu's task_tile: GEMM task rel of a rank with
// ntiles row tiles × n column blocks, in groups of m.group row tiles.
func (m *fusedModel) taskTile(rel, ntiles, n int) (tile, nb int) {
	span := m.group * n
	first := rel / span * m.group
	gsize := min(ntiles-first, m.group)
	return first + rel%span%gsize, rel % span / gsize
}

func findRank(pre []int, idx int) int {
	r := 0
	for r+2 < len(pre) && idx >= pre[r+1] {
		r++
	}
	return r
}

// queues are the prefix sums over ranks of the dispatch, combine, GEMM1
// and GEMM2 tasks.
func (m *fusedModel) queues() (dp, cp, g1, g2 []int) {
	var nd, nc, n1, n2 []int
	for _, r := range m.rk {
		nd, nc = append(nd, (r.T+m.DT-1)/m.DT), append(nc, (r.T+m.CT-1)/m.CT*m.nc)
		if m.fold {
			nc[len(nc)-1] = 0
		}
		n1, n2 = append(n1, r.numTiles*m.n1*m.ks1), append(n2, r.numTiles*m.n2*m.ks2)
	}
	return prefix(nd), prefix(nc), prefix(n1), prefix(n2)
}

// dispatchAll runs dispatch tasks until the dispatch queue is empty.
func (m *fusedModel) dispatchAll(dp []int) {
	for {
		idx := int(m.qDisp.Add(1) - 1)
		if idx >= dp[m.R] {
			return
		}
		r := findRank(dp, idx)
		if r == m.faultRank {
			continue
		}
		src := m.rk[r]
		t0 := (idx - dp[r]) * m.DT
		for a := t0 * m.K; a < min(src.T, t0+m.DT)*m.K; a++ {
			if dr := src.destRow[a]; dr >= 0 {
				d := m.rk[dr&7]
				d.recv[dr>>3] = src.x[a/m.K]
				d.arrive[(dr>>3)/m.BM].Add(1)
			}
		}
	}
}

// mainTask is main-queue task idx: kind 1 GEMM1, 2 GEMM2 (rank d, row
// tile, column block, split ks; a block's splits are neighbours), 3
// combine (rank d, first token t0, column chunk nb), 0 the end.
func (m *fusedModel) mainTask(idx int, cp, g1, g2 []int) (kind, d, tile, nb, ks int) {
	switch {
	case idx < g1[m.R]:
		d = findRank(g1, idx)
		rel := idx - g1[d]
		tile, nb = m.taskTile(rel/m.ks1, m.rk[d].numTiles, m.n1)
		return 1, d, tile, nb, rel % m.ks1
	case idx < g1[m.R]+g2[m.R]:
		idx -= g1[m.R]
		d = findRank(g2, idx)
		rel := idx - g2[d]
		tile, nb = m.taskTile(rel/m.ks2, m.rk[d].numTiles, m.n2)
		return 2, d, tile, nb, rel % m.ks2
	case idx < g1[m.R]+g2[m.R]+cp[m.R]:
		idx -= g1[m.R] + g2[m.R]
		d = findRank(cp, idx)
		rel := idx - cp[d]
		return 3, d, rel / m.nc * m.CT, rel % m.nc, 0
	}
	return 0, 0, 0, 0, 0
}

// waitInputs is a GEMM task's wait: its tile's rows (GEMM1), its tile's
// GEMM1 blocks (GEMM2).
func (m *fusedModel) waitInputs(kind, d, tile int) bool {
	rk := m.rk[d]
	if kind == 1 {
		return m.wait(&rk.arrive[tile], rk.tileWant[tile])
	}
	return m.wait(&rk.g1done[tile], m.n1)
}

// gemm runs split ks of a GEMM task whose inputs are there: its share of
// each row's sum (split s of ks: a (s+1)/(1+…+ks) part) as the block's
// partial; the split that counts last on the block's kdone sums the
// partials in split order, stores and signals (ksplit_sum).
func (m *fusedModel) gemm(kind, d, tile, nb, ks int) {
	rk := m.rk[d]
	g, n, nks := kind-1, m.n1, m.ks1
	if kind == 2 {
		n, nks = m.n2, m.ks2
	}
	blk := tile*n + nb
	share := float64(ks+1) / float64(nks*(nks+1)/2)
	for i := range m.BM {
		row := tile*m.BM + i
		if rk.rowSrc[row] < 0 {
			continue
		}
		s := float64(nb)
		if kind == 1 {
			s += rk.recv[row] * float64(rk.tileSlot[tile]+1)
		} else {
			for _, v := range rk.act[row] {
				s += v
			}
		}
		rk.part[g][blk*nks+ks][i] = s * share
	}
	if int(rk.kdone[g][blk].Add(1)) != nks {
		return // not the block's last split
	}
	for i := range m.BM {
		row := tile*m.BM + i
		src := rk.rowSrc[row]
		if src < 0 {
			continue
		}
		s := 0.0
		for q := range nks {
			s += rk.part[g][blk*nks+q][i]
		}
		if kind == 1 {
			rk.act[row][nb] = s
			continue
		}
		m.rk[src&7].ret[src>>3][nb] = s
	}
	if kind == 1 {
		rk.g1done[tile].Add(1)
		return
	}
	// The tile's rows are stored (the kernel's barrier): the signals.
	for i := range m.BM {
		src := rk.rowSrc[tile*m.BM+i]
		if src < 0 {
			continue
		}
		r, t := m.rk[src&7], (src>>3)/m.K
		if !m.fold {
			r.tokdone[t].Add(1)
			continue
		}
		if r.tokdone[t*m.n2+nb].Add(1) == 0 { // the token's last row of this block: fold_combine
			s := 0.0
			for k := range m.K {
				if r.destRow[t*m.K+k] >= 0 {
					s += r.w[t*m.K+k] * r.ret[t*m.K+k][nb]
				}
			}
			r.out[t][nb] = s
		}
	}
}

// combine waits for and sums rank r's tokens [t0, t0+CT), column chunk c.
func (m *fusedModel) combine(r, t0, c int) bool {
	return m.combineReady(r, t0) && m.combineSum(r, t0, c)
}

// combineReady waits until every routed row of rank r's tokens [t0,
// t0+CT) is back (combine_ready).
func (m *fusedModel) combineReady(r, t0 int) bool {
	rk := m.rk[r]
	for t := t0; t < min(rk.T, t0+m.CT); t++ {
		routed := 0
		for k := range m.K {
			if rk.destRow[t*m.K+k] >= 0 {
				routed++
			}
		}
		if !m.wait(&rk.tokdone[t], routed*m.n2) {
			return false
		}
	}
	return true
}

// combineSum sums rank r's tokens [t0, t0+CT), columns of chunk c
// (combine_rows).
func (m *fusedModel) combineSum(r, t0, c int) bool {
	rk := m.rk[r]
	cols := (m.n2 + m.nc - 1) / m.nc
	for t := t0; t < min(rk.T, t0+m.CT); t++ {
		for j := c * cols; j < min(m.n2, (c+1)*cols); j++ {
			s := 0.0
			for k := range m.K {
				s += rk.w[t*m.K+k] * rk.ret[t*m.K+k][j]
			}
			rk.out[t][j] = s
		}
	}
	return true
}

// cta is one persistent CTA of fused_kernel: dispatch first when it is a
// dispatch CTA, then the main queue, one task at a time. False when a wait
// gave up.
func (m *fusedModel) cta(dispatch bool) bool {
	dp, cp, g1, g2 := m.queues()
	if dispatch {
		m.dispatchAll(dp)
	}
	for {
		kind, d, tile, nb, ks := m.mainTask(int(m.qMain.Add(1)-1), cp, g1, g2)
		switch kind {
		case 0:
			return true
		case 3:
			if !m.combine(d, tile, nb) {
				return false
			}
		default:
			if !m.waitInputs(kind, d, tile) {
				return false
			}
			m.gemm(kind, d, tile, nb, ks)
		}
	}
}

// ctaWG is one CTA of fused_wg_kernel: a producer goroutine takes the main
// queue and waits for each task's inputs (a GEMM tile's rows or GEMM1
// blocks, a combine task's returned rows), then hands the task over a
// two-slot ring (the kernel's mbarrier pair) and takes the next one; the
// consumer (this goroutine) dispatches first, then runs every task from the
// ring to the end. A failed wait sets the CTA's abort word: the producer
// passes the end next, the consumer skips what is left; both drain.
func (m *fusedModel) ctaWG(dispatch bool) bool {
	dp, cp, g1, g2 := m.queues()
	nMain := g1[m.R] + g2[m.R] + cp[m.R]
	type task struct {
		idx int
		ok  bool
	}
	ring := make(chan task, 2)
	var abort atomic.Bool
	go func() {
		for {
			idx := nMain
			if !abort.Load() {
				idx = min(int(m.qMain.Add(1)-1), nMain)
			}
			ok := true
			switch kind, d, tile, _, _ := m.mainTask(idx, cp, g1, g2); kind {
			case 1, 2:
				ok = m.waitInputs(kind, d, tile)
			case 3:
				ok = m.combineReady(d, tile)
			}
			if !ok {
				abort.Store(true)
			}
			ring <- task{idx, ok}
			if idx >= nMain {
				return
			}
		}
	}()
	if dispatch {
		m.dispatchAll(dp)
	}
	good := true
	for t := range ring {
		if t.idx >= nMain {
			break
		}
		if !t.ok {
			good = false
			continue
		}
		switch kind, d, tile, nb, ks := m.mainTask(t.idx, cp, g1, g2); kind {
		case 3:
			m.combineSum(d, tile, nb)
		default:
			m.gemm(kind, d, tile, nb, ks)
		}
	}
	return good
}

func (m *fusedModel) run(ctas, dispatchCTAs int, wg bool) bool {
	var all sync.WaitGroup
	var bad atomic.Int32
	for c := range ctas {
		all.Add(1)
		go func() {
			defer all.Done()
			cta := m.cta
			if wg {
				cta = m.ctaWG
			}
			if !cta(c < dispatchCTAs) {
				bad.Add(1)
			}
		}()
	}
	all.Wait()
	return bad.Load() == 0 && m.errSet.Load() == 0
}

// TestMoEFusedProtocolModel checks the protocol's index maths, counter
// targets and deadlock freedom on the goroutine model, for both kernels'
// CTA shapes and with and without grouped rasterisation, and that a
// disabled dispatch rank ends in the watchdog instead of a hang.
func TestMoEFusedProtocolModel(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for _, c := range []protocolCase{
		{[]int{37}, 8, 2, 16, 3, 1, -1, 1, 1, 1, false},
		{[]int{5, 0, 70, 3}, 16, 4, 16, 5, 2, -1, 1, 1, 1, false},
		{[]int{130, 129, 131, 64, 1, 100, 17, 130}, 64, 8, 64, 7, 7, -1, 1, 1, 1, false},
		{[]int{1, 1, 1, 1, 1, 1, 1, 1}, 8, 8, 16, 2, 1, -1, 1, 1, 1, false},
		{[]int{20, 20}, 8, 2, 16, 4, 4, 1, 1, 1, 1, false},
		// The 16-row tiles' decode forms: split reductions, combine column chunks.
		{[]int{1}, 8, 8, 16, 5, 1, -1, 2, 3, 2, false},
		{[]int{1, 2, 0, 1}, 16, 4, 16, 6, 2, -1, 4, 2, 2, false},
		{[]int{3, 3}, 8, 2, 16, 2, 2, 1, 2, 2, 2, false},
		// The combine folded into GEMM2 (≤ 4 tokens a rank).
		{tokens: []int{1}, E: 8, K: 8, BM: 16, ctas: 5, dis: 1, fault: -1, ks1: 2, ks2: 3, nc: 1, fold: true},
		{tokens: []int{1, 2, 0, 4}, E: 16, K: 4, BM: 16, ctas: 6, dis: 2, fault: -1, ks1: 1, ks2: 2, nc: 1, fold: true},
		{tokens: []int{3, 3}, E: 8, K: 2, BM: 16, ctas: 2, dis: 2, fault: 1, ks1: 1, ks2: 1, nc: 1, fold: true},
	} {
		for _, wg := range []bool{false, true} {
			if wg && (c.ks1 > 1 || c.ks2 > 1 || c.nc > 1 || c.fold) {
				continue // the host never splits or folds the wgmma tiles' work
			}
			for _, group := range []int{1, 3} {
				kernel := "mma"
				if wg {
					kernel = "wg"
				}
				name := fmt.Sprintf("R%d_E%d_K%d_BM%d_ctas%d_fault%d_ks%dx%d_nc%d_%s_group%d", len(c.tokens), c.E, c.K,
					c.BM, c.ctas, c.fault, c.ks1, c.ks2, c.nc, kernel, group)
				if c.fold {
					name += "_fold"
				}
				t.Run(name, func(t *testing.T) { runProtocolModel(t, r, c, wg, group) })
			}
		}
	}
}

type protocolCase struct {
	tokens              []int
	E, K, BM, ctas, dis int
	fault               int // a source rank whose dispatch is disabled, or -1
	ks1, ks2, nc        int // reduction splits of GEMM1 and GEMM2, combine column chunks
	fold                bool
}

// runProtocolModel plans and runs one case on the model and checks every
// output against the tasks' scalar maths.
func runProtocolModel(t *testing.T, r *rand.Rand, c protocolCase, wg bool, group int) {
	R := len(c.tokens)
	pl := MoEBlockPlacement(c.E, R)
	pl.Replicate(0, R-1)
	tab, err := pl.Table()
	if err != nil {
		t.Fatal(err)
	}
	m := &fusedModel{R: R, K: c.K, E: c.E, BM: c.BM, n1: 3, n2: 2, DT: 16, CT: 8, place: tab,
		timeout: 200 * time.Millisecond, faultRank: c.fault, group: group, ks1: c.ks1, ks2: c.ks2, nc: c.nc,
		fold: c.fold}
	for q := range R {
		rk := &modelRank{T: c.tokens[q], S: pl.Slots[q]}
		for range rk.T {
			rk.x = append(rk.x, r.Float64())
			for _, e := range r.Perm(c.E)[:c.K] {
				rk.ids = append(rk.ids, int32(e))
				rk.w = append(rk.w, r.Float64())
			}
		}
		m.rk = append(m.rk, rk)
	}
	m.plan()
	ok := m.run(c.ctas, c.dis, wg)
	if c.fault >= 0 {
		if ok {
			t.Fatal("a disabled dispatch rank did not end in the watchdog")
		}
		return
	}
	if !ok {
		t.Fatal("a wait timed out")
	}
	slotExp := pl.SlotExperts()
	for q, rk := range m.rk {
		for tk := range rk.T {
			for j := range m.n2 {
				want := 0.0
				for k := range m.K {
					p := tab[q*c.E+int(rk.ids[tk*m.K+k])]
					slot := int(p & 0xffff)
					if slotExp[p>>16][slot] != int(rk.ids[tk*m.K+k]) {
						t.Fatalf("table sends expert %d to a slot holding %d", rk.ids[tk*m.K+k], slotExp[p>>16][slot])
					}
					s := float64(j)
					for n := range m.n1 {
						s += rk.x[tk]*float64(slot+1) + float64(n)
					}
					want += rk.w[tk*m.K+k] * s
				}
				if got := rk.out[tk][j]; math.Abs(got-want) > 1e-9*math.Max(1, math.Abs(want)) {
					t.Fatalf("rank %d token %d column %d: %v, want %v", q, tk, j, got, want)
				}
			}
		}
	}
}

// TestMoEPlacement: block placement, replicas, the table's choice of copy
// (local first, else spread over the copies) and the checks (no GPU).
func TestMoEPlacement(t *testing.T) {
	p := MoEBlockPlacement(10, 4)
	if got := fmt.Sprint(p.Slots); got != "[3 2 3 2]" {
		t.Fatalf("block placement of 10 experts on 4 ranks: slots %s", got)
	}
	p.Replicate(0, 2) // expert 0 on ranks 0 and 2
	p.Replicate(0, 3)
	tab, err := p.Table()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ src, e, rank, slot int }{
		{0, 0, 0, 0}, {2, 0, 2, 3}, {3, 0, 3, 2}, {1, 0, 2, 3}, // source 1 has no copy: copy 1 mod 3 (rank 2 slot 3)
		{1, 9, 3, 1}, {0, 5, 2, 0},
	} {
		got := tab[c.src*10+c.e]
		if want := int32(c.rank<<16 | c.slot); got != want {
			t.Errorf("source %d expert %d: %#x, want rank %d slot %d", c.src, c.e, got, c.rank, c.slot)
		}
	}
	se := p.SlotExperts()
	if se[2][3] != 0 || se[3][2] != 0 || se[0][0] != 0 || se[3][1] != 9 {
		t.Errorf("slot experts %v", se)
	}
	bad := MoEBlockPlacement(4, 2)
	bad.Slots[1]++
	if err := bad.Check(); err == nil {
		t.Error("a slot without an expert passed Check")
	}
	bad = MoEBlockPlacement(4, 2)
	bad.Replicas[1] = append(bad.Replicas[1], bad.Replicas[0][0])
	if err := bad.Check(); err == nil {
		t.Error("two copies in one slot passed Check")
	}
	if err := (&MoEPlacement{Slots: make([]int, 9), Replicas: [][]MoEReplica{{{0, 0}}}}).Check(); err == nil {
		t.Error("nine ranks passed Check")
	}
}

// TestTaskTile: the grouped rasterisation (moe_fused.cu's task_tile) maps a
// rank's GEMM tasks onto every (row tile, column block) exactly once, and
// tasks in a group of row tiles share their column block.
func TestTaskTile(t *testing.T) {
	for _, group := range []int{1, 2, 3, 8} {
		m := &fusedModel{group: group}
		for ntiles := 1; ntiles <= 11; ntiles++ {
			for n := 1; n <= 5; n++ {
				seen := make(map[[2]int]bool)
				for rel := range ntiles * n {
					tile, nb := m.taskTile(rel, ntiles, n)
					if tile < 0 || tile >= ntiles || nb < 0 || nb >= n || seen[[2]int{tile, nb}] {
						t.Fatalf("group %d, %d tiles × %d blocks: task %d → (%d, %d) out of range or twice", group, ntiles, n, rel, tile, nb)
					}
					seen[[2]int{tile, nb}] = true
					// Inside a group, the column block changes only when the row tile wraps to the group's first.
					if first := rel / (group * n) * group; tile != first {
						if _, prev := m.taskTile(rel-1, ntiles, n); prev != nb {
							t.Fatalf("group %d: task %d (tile %d) has block %d, task %d block %d", group, rel, tile, nb, rel-1, prev)
						}
					}
				}
			}
		}
	}
}
