package cuda

import (
	"fmt"
	"os"
	"slices"
	"sync"

	"github.com/mkserve/mkserve/attention"
	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/kernels"
)

// kvLayer is one layer's pool: keys [blocks*bs, kw] and values
// [blocks*bs, vw] in bf16 (kv head h at columns h*headDim..), the layout
// kernels.PagedAttnBF16 and the prefill kernels read through block tables.
type kvLayer struct {
	kw, vw int
	elem   int // bytes per element: 2 (bf16) or 4 (float32)
	blocks int
	k, v   *kernels.Buffer
}

// pagedKV is the pool of InitKV: numBlocks blocks of blockSize tokens per
// layer, each layer allocated at its first Attention call.
type pagedKV struct {
	blockSize, numBlocks int
	layers               []*kvLayer
	meta                 metaCache
}

// kvElem is the bytes of one cached key or value element: 2 (bf16), or 4
// (float32) with Options.KVCacheF32.
func (be *Backend) kvElem() int { return map[bool]int{false: 2, true: 4}[be.kvF32] }

// privateBlock is the block size of the unpaged (per-sequence) cache.
const privateBlock = 16

// privateKV backs spans without a block table: each sequence gets private
// blocks from a growing per-layer pool, and counts its cached tokens per
// layer (so it can be rolled back by resubmitting from an earlier Past).
type privateKV struct {
	layers map[[3]int]*kvLayer // by (layer, kw, vw): capacity grows on demand, the same block ids in every layer
	free   []int32
	next   int32
	seqs   map[uint64]*privSeq
	meta   metaCache
}

type privSeq struct {
	blocks []int32
	tokens []int // per layer
}

func newPrivateKV() *privateKV {
	return &privateKV{seqs: map[uint64]*privSeq{}, layers: map[[3]int]*kvLayer{}}
}

// layerAt returns layers[l] of a pool, allocating it with blocks blocks of
// bs tokens and widths kw, vw; it panics on a width mismatch.
func layerAt(d *kernels.Device, layers *[]*kvLayer, l, blocks, bs, kw, vw, elem int) *kvLayer {
	if l >= len(*layers) {
		*layers = append(*layers, make([]*kvLayer, l+1-len(*layers))...)
	}
	pl := (*layers)[l]
	if pl == nil {
		pl = &kvLayer{kw: kw, vw: vw, elem: elem}
		grow(d, pl, blocks, bs)
		(*layers)[l] = pl
	}
	if pl.kw != kw || pl.vw != vw {
		panic(fmt.Sprintf("layer %d: KV cache widths %d/%d, span wants %d/%d", l, pl.kw, pl.vw, kw, vw))
	}
	return pl
}

// grow reallocates pl for blocks blocks (≥ its current count), keeping its contents.
func grow(d *kernels.Device, pl *kvLayer, blocks, bs int) {
	if blocks <= pl.blocks {
		return
	}
	kvElem := int64(pl.elem)
	k, err := d.Malloc(int64(blocks) * int64(bs) * int64(pl.kw) * kvElem)
	must("KV cache", err)
	var v *kernels.Buffer // nil: the values live inside the keys (vw 0)
	if pl.vw > 0 {
		if v, err = d.Malloc(int64(blocks) * int64(bs) * int64(pl.vw) * kvElem); err != nil {
			k.Free()
			must("KV cache", err)
		}
	}
	if pl.blocks > 0 {
		must("KV cache", d.Copy(k, pl.k, int64(pl.blocks)*int64(bs)*int64(pl.kw)*kvElem))
		must("KV cache", pl.k.Free())
		if v != nil {
			must("KV cache", d.Copy(v, pl.v, int64(pl.blocks)*int64(bs)*int64(pl.vw)*kvElem))
			must("KV cache", pl.v.Free())
		}
	}
	pl.k, pl.v, pl.blocks = k, v, blocks
}

// attnGroup is the part of a batch that reads one pool.
type attnGroup struct {
	slots  []int32 // [T] pool row of each batch row's new k/v, -1: other group
	rows   []int32 // batch rows attending
	pos    []int32 // their positions
	table  []int32 // offsets of their block tables in blocks
	blocks []int32 // block tables, concatenated
	any    bool

	// Per span, for the prefill kernel (kernels.FlashAttention):
	seqStart []int32 // first q row
	seqPast  []int32 // cached tokens before it
	seqTable []int32 // offset of its block table in blocks
	maxLen   int     // longest span
	lastLen  int     // rows of the last span added
	gaps     bool    // the spans' rows are not one consecutive run

	ring  bool       // context-parallel spans go to the ring kernel (ringFits)
	rings []ringSpan // those spans

	// In an expert-parallel world of processes (Backend.world), a
	// context-parallel span's rows are split zigzag over the processes
	// instead (world.go, worldCPAttention).
	worldR, worldMe int
	worldCP         []ringSpan
}

// flashes reports whether the group's rows can go through the flash
// prefill kernel: a prefill group without gaps, head dims it takes,
// FlashEnv not 0 (the layer's cache must also hold values apart from keys).
func (g *attnGroup) flashes(D, Dv int) bool {
	return g.maxLen > 1 && !g.gaps && flashFits(D, Dv) && flashOn()
}

// worldSplit reports whether span s is split over the world's processes.
func (g *attnGroup) worldSplit(s backend.SeqSpan) bool {
	return g.ring && g.worldR > 1 && s.ContextParallel > 1 && s.Len >= 2*g.worldR
}

// ringSpan is a context-parallel span and its block table.
type ringSpan struct {
	span   backend.SeqSpan
	blocks []int32
}

// ringed reports whether span s runs as ring attention.
func (g *attnGroup) ringed(s backend.SeqSpan) bool {
	return g.ring && s.ContextParallel > 1 && s.ContextParallel <= kernels.RingMaxRanks && s.Len >= 2*s.ContextParallel
}

func newGroup(T int) *attnGroup { return newGroupCap(T, 0, 0) }

// newGroupCap is newGroup with room for rows attending rows (and as many
// spans) and blocks block ids (no growth while they are added).
func newGroupCap(T, rows, blocks int) *attnGroup {
	g := &attnGroup{slots: make([]int32, T), rows: make([]int32, 0, rows), pos: make([]int32, 0, rows),
		table: make([]int32, 0, rows), blocks: make([]int32, 0, blocks), seqStart: make([]int32, 0, rows),
		seqPast: make([]int32, 0, rows), seqTable: make([]int32, 0, rows)}
	for i := range g.slots {
		g.slots[i] = -1
	}
	return g
}

// setSlots records the pool slot of each of span s's rows (where its k/v go).
func (g *attnGroup) setSlots(s backend.SeqSpan, blocks []int32, bs int) {
	for j := 0; j < s.Len; j++ {
		p := s.Past + j
		g.slots[s.Offset+j] = blocks[p/bs]*int32(bs) + int32(p%bs)
	}
}

// add appends span s with block table blocks of bs-token blocks, padded
// to pad entries by repeating its last id when pad is larger (a graph
// step's fixed stride; the kernels never read past a row's own positions).
func (g *attnGroup) add(s backend.SeqSpan, blocks []int32, bs, pad int) {
	g.any = true
	if g.worldSplit(s) {
		// Every process writes the span's k/v; each attends its share of the rows.
		g.setSlots(s, blocks, bs)
		g.worldCP = append(g.worldCP, ringSpan{span: s, blocks: blocks})
		return
	}
	if g.ringed(s) {
		// Its k/v are written with the group's; ringAttention attends its rows.
		g.setSlots(s, blocks, bs)
		g.rings = append(g.rings, ringSpan{span: s, blocks: blocks})
		return
	}
	off := int32(len(g.blocks))
	g.blocks = append(g.blocks, blocks...)
	for n := len(blocks); n < pad; n++ {
		g.blocks = append(g.blocks, blocks[len(blocks)-1])
	}
	blocks = g.blocks[off:] // the padded table
	if n := len(g.seqStart); n > 0 && int(g.seqStart[n-1])+g.lastLen != s.Offset {
		g.gaps = true
	}
	g.seqStart = append(g.seqStart, int32(s.Offset))
	g.seqPast = append(g.seqPast, int32(s.Past))
	g.seqTable = append(g.seqTable, off)
	g.maxLen = max(g.maxLen, s.Len)
	g.lastLen = s.Len
	for j := 0; j < s.Len; j++ {
		p := s.Past + j
		g.slots[s.Offset+j] = blocks[p/bs]*int32(bs) + int32(p%bs)
		g.rows = append(g.rows, int32(s.Offset+j))
		g.pos = append(g.pos, int32(p))
		g.table = append(g.table, off)
	}
}

// Attention appends k, v to the layer's KV cache for every sequence of the
// batch and attends causally: q [T, H*D], k [T, KVH*D], v [T, KVH*Dv] →
// [T, H*Dv], with the semantics of the CPU backend (attention.Causal):
// GQA, sliding window (keys i-W < j ≤ i), sinks joining the softmax
// denominator, VHeadDim ≠ HeadDim.
//
// The cache holds keys and values in bf16 (k and v are rounded once, when
// written); every row, prefill or decode, runs kernels.PagedAttnBF16 with
// float32 q and arithmetic. Head dims must be multiples of 8 up to 256.
//
// Spans with a block table write and read the InitKV pool in place. Spans
// without one use the private per-sequence cache: it must hold at least
// Past tokens of (ID, layer), and positions from Past on are replaced. A
// cache holding fewer than Past tokens, other widths than the layer's first
// call, a duplicated ID, a block table too short or with ids outside the
// pool, an invalid batch or bad shapes panic.
func (be *Backend) Attention(q, k, v backend.Tensor, b *backend.Batch, p *backend.AttnParams) backend.Tensor {
	out, _ := be.attention(q, k, v, b, p, false, nil)
	return out
}

// normRoPEArgs are NormRoPEAttention's norms and rotation, for attention.
type normRoPEArgs struct {
	qw, kw *Tensor // [HeadDim] or nil
	eps    float32
	rope   *attention.RoPE
	style  kernels.RoPEStyle
	// whole, when set, runs instead of the decode attention kernel (the
	// persistent layer, DecodeLayer): with the layer's pool, the group's
	// metadata, the block size, the RoPE positions and frequencies.
	whole func(d *kernels.Device, pl *kvLayer, m attnMeta, blockSize int, ropePos *kernels.Buffer, f *ropeFreqs) error
}

// NormRoPEAttention implements backend.NormRoPEAttender: in the fast
// profile, a batch of decode spans (one new token each, all with block
// tables, none context-parallel) on the bf16 cache runs q's and k's
// per-head norms, RoPE, the KV write and attention as one kernel
// (kernels.PagedDecodeBF16), which reads the cached keys before the q/k/v
// projection has finished. Other batches and shapes (OLMoE's norms over
// all heads, head dims the warp-split kernel lacks, MLA) return ok false.
func (be *Backend) NormRoPEAttention(q, k, v, qw, kw backend.Tensor, eps float32, rope *attention.RoPE,
	b *backend.Batch, p *backend.AttnParams) (backend.Tensor, bool) {
	if be.split || be.kvF32 || !fusedDecodeOn() || b == nil || p == nil || rope == nil || rope.Validate() != nil ||
		rope.Dim > p.HeadDim || p.ValuesInKeys {
		return nil, false
	}
	for _, s := range b.Seqs {
		if s.Len != 1 || s.Blocks == nil {
			return nil, false
		}
	}
	if sharesBlocks(b) { // a verify step's spans: each must see the KV the others write first
		return nil, false
	}
	qwt, ok1 := headNormWeight("NormRoPEAttention", qw, p.HeadDim)
	kwt, ok2 := headNormWeight("NormRoPEAttention", kw, p.HeadDim)
	if !ok1 || !ok2 || !be.decodeFits(p, rope.Dim) {
		return nil, false
	}
	_, _, style := ropeInput("NormRoPEAttention", q, p.NumHeads*p.HeadDim, rope, b.Positions)
	out, ok := be.attention(q, k, v, b, p, false, &normRoPEArgs{qw: qwt, kw: kwt, eps: eps, rope: rope, style: style})
	if !ok {
		return nil, false
	}
	return out, true
}

// sharesBlocks reports whether two of b's spans have the same block table
// (the engine's speculative verify steps: one-token spans of one sequence,
// token j attending the KV of tokens before it in the same step). The
// fused decode kernel writes each span's KV and attends in one pass, so
// such a batch takes the separate kernels, which write every span's KV
// first.
func sharesBlocks(b *backend.Batch) bool {
	var seen map[*int32]bool
	for _, s := range b.Seqs {
		if len(s.Blocks) == 0 {
			continue
		}
		p := &s.Blocks[0]
		if seen == nil {
			seen = make(map[*int32]bool, len(b.Seqs))
		}
		if seen[p] {
			return true
		}
		seen[p] = true
	}
	return false
}

// FusedDecodeEnv names the environment variable that, set to 0, runs a
// decode step's q/k norms, RoPE, KV write and attention as separate
// kernels (NormRoPE, then Attention) instead of one, for comparisons.
const FusedDecodeEnv = "MKSERVE_FUSED_DECODE"

var fusedDecodeOn = sync.OnceValue(func() bool { return os.Getenv(FusedDecodeEnv) != "0" })

// decodeFits reports (and remembers) whether kernels.PagedDecodeFits
// takes p's shapes with rotation dims rot.
func (be *Backend) decodeFits(p *backend.AttnParams, rot int) bool {
	key := [5]int{p.NumHeads, p.NumKVHeads, p.HeadDim, p.VHeadDim, rot}
	be.ropeMu.Lock()
	fits, ok := be.decodeFit[key]
	be.ropeMu.Unlock()
	if ok {
		return fits
	}
	_ = be.g.Do(func(d *kernels.Device) error {
		if err := pagedVariant(d); err != nil {
			return err
		}
		fits = d.PagedDecodeFits(kernels.AttnArgs{Heads: p.NumHeads, KVHeads: p.NumKVHeads, HeadDim: p.HeadDim,
			VHeadDim: p.VHeadDim}, rot)
		return nil
	})
	be.ropeMu.Lock()
	if be.decodeFit == nil {
		be.decodeFit = map[[5]int]bool{}
	}
	be.decodeFit[key] = fits
	be.ropeMu.Unlock()
	return fits
}

// attention is Attention; with writeOnly it only appends k and v to the
// cache (q is not read and may be nil) and returns nil. With nr, q and k
// are the raw projections, normed and rotated by the attention kernel
// itself (NormRoPEAttention): ok is false, and nothing was done, when the
// batch's groups do not allow that.
func (be *Backend) attention(q, k, v backend.Tensor, b *backend.Batch, p *backend.AttnParams, writeOnly bool,
	nr *normRoPEArgs) (res *Tensor, ok bool) {
	if b == nil || p == nil {
		panicf("Attention", "nil batch or params")
	}
	// Inside a graph step every layer gets the step's batch, unchanged: the
	// first layer validates it and builds (or finds) its paged group, the
	// others reuse that (stepBatch; at 256 rows the signature's pass over
	// every block table and the validation took ~50 µs a layer on the host).
	stepHit := be.graphMode() != graphOff && be.attnMemo.stepBatch == b
	if !stepHit {
		if err := b.Validate(); err != nil {
			panicf("Attention", "%v", err)
		}
	}
	H, KV, D, Dv := p.NumHeads, p.NumKVHeads, p.HeadDim, p.VHeadDim
	if H <= 0 || KV <= 0 || D <= 0 || Dv <= 0 || p.Layer < 0 {
		panicf("Attention", "layer %d heads %d/%d dims %d/%d", p.Layer, H, KV, D, Dv)
	}
	T := len(b.Tokens)
	var qt *Tensor
	qr := T
	if !writeOnly {
		qt, qr = matrix("Attention", "q", q, H*D)
	}
	kt, kr := matrix("Attention", "k", k, KV*D)
	vt, vr := matrix("Attention", "v", v, KV*Dv)
	if qr != T || kr != T || vr != T {
		panicf("Attention", "q rows %d, k %v, v %v for a batch of %d tokens", qr, kt.shape, vt.shape, T)
	}
	sinks := vector("Attention", "Sinks", p.Sinks, H)
	params := &attention.Params{NumHeads: H, NumKVHeads: KV, HeadDim: D, VHeadDim: Dv, Scale: p.Scale, Window: p.Window}
	if err := params.Validate(); err != nil {
		panicf("Attention", "%v", err)
	}
	if err := p.CheckValuesInKeys(); err != nil {
		panicf("Attention", "%v", err)
	}
	kw, vw := KV*D, KV*Dv
	if p.ValuesInKeys {
		if be.kvF32 {
			panicf("Attention", "layer %d: values inside keys on the float32 cache (ValuesInKeys says no there)", p.Layer)
		}
		vw = 0 // v's rows are the keys' first Dv columns: not cached
	}

	be.kvMu.Lock()
	defer be.kvMu.Unlock()
	paged, priv := newGroup(T), newGroup(T)
	paged.ring = !be.kvF32 && flashFits(D, Dv) && !p.ValuesInKeys // the flash kernels read a V pool
	priv.ring = paged.ring
	if w := be.world; w != nil {
		paged.worldR, paged.worldMe = w.R, w.me
		priv.worldR, priv.worldMe = w.R, w.me
	}
	// Every layer of a step builds the same paged group: a call whose
	// inputs equal the last build's reuses it (attnMemo).
	var sig []int64
	hit := stepHit && be.attnMemo.stepPaged && be.attnMemo.stepRing == paged.ring
	if !hit {
		sig = be.pagedSignature(b, paged.ring)
		hit = sig != nil && slices.Equal(sig, be.attnMemo.sig)
	}
	if hit {
		paged = be.attnMemo.group
	}
	var seen map[uint64]bool
	if !hit {
		seen = make(map[uint64]bool, len(b.Seqs))
	}
	type privUse struct {
		seq *privSeq
		end int
	}
	var privs []privUse
	graphKeys := 0
	if be.graphMode() != graphOff {
		graphKeys = be.gr.key.keys
	}
	for i, s := range b.Seqs {
		if hit {
			break
		}
		if seen[s.ID] {
			panicf("Attention", "sequence %d appears twice in the batch", s.ID)
		}
		seen[s.ID] = true
		n := s.Past + s.Len
		if s.Blocks != nil {
			be.addPaged(paged, s, i, graphKeys)
			continue
		}
		pv := be.priv
		sq := pv.seqs[s.ID]
		if sq == nil {
			sq = &privSeq{}
			pv.seqs[s.ID] = sq
		}
		if p.Layer >= len(sq.tokens) {
			sq.tokens = append(sq.tokens, make([]int, p.Layer+1-len(sq.tokens))...)
		}
		if sq.tokens[p.Layer] < s.Past {
			panicf("Attention", "sequence %d layer %d: cache holds %d tokens, span wants past %d",
				s.ID, p.Layer, sq.tokens[p.Layer], s.Past)
		}
		for len(sq.blocks)*privateBlock < n {
			var id int32
			if l := len(pv.free); l > 0 {
				id, pv.free = pv.free[l-1], pv.free[:l-1]
			} else {
				id = pv.next
				pv.next++
			}
			sq.blocks = append(sq.blocks, id)
		}
		privs = append(privs, privUse{sq, n})
		priv.add(s, sq.blocks, privateBlock, 0)
	}
	if sig != nil && !hit {
		be.attnMemo.sig, be.attnMemo.group = append(be.attnMemo.sig[:0], sig...), paged
	}
	if be.graphMode() != graphOff {
		// Later layers of this step: no validation; the paged group is
		// attnMemo's when every span is paged (sig != nil or a hit).
		be.attnMemo.stepBatch, be.attnMemo.stepPaged, be.attnMemo.stepRing = b, hit || sig != nil, paged.ring
	}
	if nr != nil && (writeOnly || priv.any || !paged.any || len(paged.rings) > 0 || len(paged.worldCP) > 0 ||
		paged.maxLen != 1 || len(paged.rows) != T) {
		return nil, false
	}

	// A prefill whose rows all go through the flash kernel in one group
	// may write its output in bf16 only (PrefillBF16Env): the o
	// projection reads that, with no float32 output and no conversion.
	bf16Out := prefillBF16() && !writeOnly && !be.split && !be.kvF32 && T > 0 && paged.any && !priv.any &&
		len(paged.rings) == 0 && len(paged.worldCP) == 0 && len(paged.rows) == T && paged.flashes(D, Dv)
	var out *Tensor
	be.do("Attention", func(d *kernels.Device) error {
		if err := pagedVariant(d); err != nil {
			return err
		}
		switch {
		case writeOnly:
		case bf16Out:
			out = be.newBF16(d, T, H*Dv)
		default:
			out = be.newF32(d, T, H*Dv)
		}
		if T == 0 {
			return nil
		}
		a := kernels.AttnArgs{Heads: H, KVHeads: KV, HeadDim: D, VHeadDim: Dv, Scale: p.Scale, Window: p.Window}
		var sk *kernels.Buffer
		if sinks != nil {
			sk = be.f32(d, sinks)
		}
		kb, vb := be.f32(d, kt), be.f32(d, vt)
		var qb *kernels.Buffer
		if !writeOnly {
			qb = be.f32(d, qt)
		}
		// q in bf16 for the prefill kernels: the rounding kept with q (the
		// fast profile's NormRoPE writes it), else converted here into a
		// buffer of this call's own.
		var qbf *kernels.Buffer
		qbfOwned := false
		defer func() {
			if qbfOwned {
				be.alloc.put(qbf)
			}
		}()
		qBF16 := func() error {
			if qbf != nil {
				return nil
			}
			if qt.st.bf16 != nil && !be.split {
				qbf = qt.st.bf16
				return nil
			}
			qbf, qbfOwned = be.alloc.get(d, int64(T*H*D)*2), true
			return d.ConvertF32ToBF16(nil, qbf, qb, T*H*D)
		}
		for gi, g := range []*attnGroup{paged, priv} {
			if !g.any {
				continue
			}
			var pl *kvLayer
			if gi == 0 {
				pl = layerAt(d, &be.paged.layers, p.Layer, be.paged.numBlocks, be.paged.blockSize, kw, vw, be.kvElem())
				a.BlockSize = be.paged.blockSize
			} else {
				need := 0
				for _, id := range g.blocks {
					need = max(need, int(id)+1)
				}
				key := [3]int{p.Layer, kw, vw}
				pl = be.priv.layers[key]
				if pl == nil {
					pl = &kvLayer{kw: kw, vw: vw, elem: be.kvElem()}
					be.priv.layers[key] = pl
				}
				if need > pl.blocks {
					grow(d, pl, max(need, 2*pl.blocks, 64), privateBlock)
				}
				a.BlockSize = privateBlock
			}
			var mc *metaCache
			if gi == 0 {
				mc = &be.paged.meta
			} else {
				mc = &be.priv.meta
			}
			ups := mc.uploads
			m := mc.get(be, d, g, T)
			if gi == 0 && mc.uploads != ups {
				be.noteInput(d, be.pagedMetaInput(paged.ring))
			}
			if pl.elem == 4 { // the float32 cache: the exact path
				if err := d.KVWriteF32(nil, pl.k, pl.v, kb, vb, m.slots, T, kw, vw); err != nil {
					return err
				}
				if len(g.rows) == 0 || writeOnly {
					continue
				}
				if err := d.AttentionF32(nil, out.st.f32, qb, pl.k, pl.v, m.rows, m.pos, m.table, m.blocks, sk,
					len(g.rows), a); err != nil {
					return err
				}
				continue
			}
			if nr == nil {
				if err := d.KVWriteBF16(nil, pl.k, pl.v, kb, vb, m.slots, T, kw, vw); err != nil {
					return err
				}
			}
			if writeOnly {
				continue
			}
			if (len(g.worldCP) > 0 || len(g.rings) > 0) && pl.v == nil {
				return fmt.Errorf("layer %d: context-parallel attention over a cache whose values live inside its keys is not built",
					p.Layer)
			}
			if len(g.worldCP) > 0 {
				if err := qBF16(); err != nil {
					return err
				}
			}
			for _, ws := range g.worldCP {
				if err := be.worldCPAttention(d, out.st.f32, qbf, pl, ws, a, sk, T); err != nil {
					return err
				}
			}
			for _, rs := range g.rings {
				if err := be.ringAttention(d, out.st.f32, qb, pl, rs, a, sk); err != nil {
					return err
				}
			}
			if len(g.rows) == 0 {
				continue
			}
			if nr != nil && nr.whole != nil {
				if err := nr.whole(d, pl, m, a.BlockSize, be.positions(d, b.Positions), be.freqs(d, nr.rope)); err != nil {
					return err
				}
				continue
			}
			if bf16Out && pl.v == nil { // values inside keys: not the flash path; float32 after all
				be.attach(out, &out.st.f32, be.alloc.get(d, int64(T*H*Dv)*4))
				be.alloc.put(out.st.bf16)
				out.st.bf16, bf16Out = nil, false
			}
			if g.flashes(D, Dv) && pl.v != nil {
				// A prefill step: every span of the group through the
				// tensor-core prefill kernel (decode spans as 1-row sequences).
				if err := qBF16(); err != nil {
					return err
				}
				fm := mc.flash(be, d, g)
				ob, odt := out.st.f32, kernels.F32
				if bf16Out {
					ob, odt = out.st.bf16, kernels.BF16
				}
				err := d.FlashAttention(nil, ob, qbf, pl.k, pl.v, fm.start, fm.past, fm.table, m.blocks, sk,
					kernels.FlashArgs{Batch: len(g.seqStart), MaxQLen: g.maxLen, Tokens: T, Heads: H, KVHeads: KV,
						HeadDim: D, VHeadDim: Dv, BlockSize: a.BlockSize, PoolRows: pl.blocks * a.BlockSize,
						NumBlocks: len(g.blocks), Scale: p.Scale, Window: p.Window, Causal: true, Out: odt})
				if err != nil {
					return err
				}
				continue
			}
			maxKeys := 0
			for _, ps := range g.pos {
				n := int(ps) + 1
				if p.Window > 0 {
					n = min(n, p.Window)
				}
				maxKeys = max(maxKeys, n)
			}
			if gi == 0 && be.graphMode() != graphOff {
				// A graph step plans for its key's bucket, whatever the
				// contexts of this step (an upper bound is a valid hint).
				maxKeys = be.gr.key.keys
				if p.Window > 0 {
					maxKeys = min(maxKeys, p.Window)
				}
			}
			ws, err := d.PagedAttnWorkspace(len(g.rows), maxKeys, a)
			if err != nil {
				return err
			}
			var work *kernels.Buffer
			if ws > 0 {
				work = be.alloc.get(d, ws)
			}
			// The fast profile's o projection reads the output in bf16: when
			// this launch writes every row of it, it also writes that
			// rounding (bf16Of's values), kept with the tensor.
			var outb *kernels.Buffer
			if !be.split && gi == 0 && !priv.any && len(g.rings) == 0 && len(g.worldCP) == 0 && len(g.rows) == T {
				outb = be.alloc.get(d, int64(T*H*Dv)*2)
				be.attach(out, &out.st.bf16, outb)
			}
			if nr != nil { // q and k raw: normed, rotated and k/v stored by the kernel
				f := be.freqs(d, nr.rope)
				nw := kernels.DecodeNew{K: kb, V: vb, Slots: m.slots, RoPEPos: be.positions(d, b.Positions),
					InvFreq: f.inv, Tokens: T, RotDim: nr.rope.Dim, Style: nr.style, AttnFactor: f.attn, Eps: nr.eps}
				if nr.qw != nil {
					nw.QNorm = be.f32(d, nr.qw)
				}
				if nr.kw != nil {
					nw.KNorm = be.f32(d, nr.kw)
				}
				err = d.PagedDecodeBF16(nil, out.st.f32, outb, qb, pl.k, pl.v, m.rows, m.pos, m.table, m.blocks, sk,
					work, len(g.rows), maxKeys, a, nw)
			} else {
				err = d.PagedAttnBF16(nil, out.st.f32, outb, qb, pl.k, pl.v, m.rows, m.pos, m.table, m.blocks, sk,
					work, len(g.rows), maxKeys, a)
			}
			be.alloc.put(work)
			if err != nil {
				return err
			}
		}
		return nil
	}, qt, kt, vt, sinks)
	for _, u := range privs {
		u.seq.tokens[p.Layer] = u.end
	}
	return out, true
}

// addPaged adds span i of a batch, s (with a block table), to the paged
// group g: its table is checked against the pool and, in a graph step of
// key keys (0: not a graph step), padded to the key's stride (a padding row
// of GraphStep reads block 0 and stores nothing). It panics on a bad span;
// be.kvMu held.
func (be *Backend) addPaged(g *attnGroup, s backend.SeqSpan, i, keys int) {
	n := s.Past + s.Len
	pk := be.paged
	if pk == nil {
		panicf("Attention", "span %d has a block table but no paged KV cache exists (call InitKV)", i)
	}
	need := (n + pk.blockSize - 1) / pk.blockSize
	if len(s.Blocks) < need {
		panicf("Attention", "position %d needs block %d, the block table has %d", n-1, need-1, len(s.Blocks))
	}
	for _, id := range s.Blocks[:need] {
		if id < 0 || int(id) >= pk.numBlocks {
			panicf("Attention", "block id %d outside the pool of %d", id, pk.numBlocks)
		}
	}
	pf := be.gr.padFrom.Load()
	padding := pf > 0 && int64(s.Offset) >= pf
	tbl := s.Blocks
	if padding {
		tbl = s.Blocks[:1]
	}
	stride := 0
	if keys > 0 {
		// A graph step: every row's table padded to the key's stride.
		stride = (keys + pk.blockSize - 1) / pk.blockSize
		if !padding {
			if need > stride {
				panicf("Attention", "%v: position %d beyond the graph's %d keys", errDiverged, n-1, keys)
			}
			tbl = s.Blocks[:need]
		}
	}
	g.add(s, tbl, pk.blockSize, stride)
	if padding {
		g.slots[s.Offset] = -1
	}
}

// attnMemo is the paged attention group of the latest Attention call and
// the inputs it was built from (pagedSignature); a group is never changed
// once built.
type attnMemo struct {
	sig     []int64
	group   *attnGroup
	scratch []int64
	// stepBatch is the batch of the graph step running now once its first
	// layer has been through Attention (nil outside graph steps:
	// resetStepCaches clears it at both ends of a step); stepPaged, that
	// every span of it is paged, so group is its paged group (for layers
	// of the same ring flag).
	stepBatch *backend.Batch
	stepPaged bool
	stepRing  bool // the group's ring flag (head dims decide it per layer)
}

// pagedSignature lists everything the paged group of Attention depends on
// (the pool's shape, the graph key and padding, the ring flag, every span
// and its whole block table), or nil when a span has no block table (the
// private cache keeps per-layer state) or no pool exists; be.kvMu held.
// Comparing it costs a pass over the block tables; building the group
// again costs allocations and appends per row (on the H200, ~0.3 ms a layer
// at 256 rows).
func (be *Backend) pagedSignature(b *backend.Batch, ring bool) []int64 {
	pk := be.paged
	if pk == nil {
		return nil
	}
	b2i := func(v bool) int64 {
		if v {
			return 1
		}
		return 0
	}
	graph := be.graphMode() != graphOff
	keys := 0
	if graph {
		keys = be.gr.key.keys
	}
	s := append(be.attnMemo.scratch[:0], int64(len(b.Tokens)), int64(pk.blockSize), int64(pk.numBlocks), b2i(ring),
		b2i(graph), int64(keys), be.gr.padFrom.Load(), int64(len(b.Seqs)))
	for _, sp := range b.Seqs {
		if sp.Blocks == nil {
			be.attnMemo.scratch = s
			return nil
		}
		s = append(s, int64(sp.ID), int64(sp.Offset), int64(sp.Len), int64(sp.Past), int64(sp.ContextParallel),
			int64(len(sp.Blocks)))
		for _, id := range sp.Blocks {
			s = append(s, int64(id))
		}
	}
	be.attnMemo.scratch = s
	return s
}

// FreeSequence drops sequence id's unpaged KV cache (its private blocks).
func (be *Backend) FreeSequence(id uint64) {
	be.kvMu.Lock()
	defer be.kvMu.Unlock()
	if sq := be.priv.seqs[id]; sq != nil {
		be.priv.free = append(be.priv.free, sq.blocks...)
		delete(be.priv.seqs, id)
	}
}

// InitKV allocates the paged KV cache: numBlocks blocks of blockSize tokens
// per attention layer, each layer's pool allocated at its first Attention
// call. Calling it again frees the old pool.
func (be *Backend) InitKV(blockSize, numBlocks int) error {
	if blockSize <= 0 || numBlocks <= 0 {
		return fmt.Errorf("cuda: InitKV: block size %d and block count %d must be positive", blockSize, numBlocks)
	}
	be.dropGraphs() // they hold the old pool's addresses
	be.kvMu.Lock()
	defer be.kvMu.Unlock()
	if old := be.paged; old != nil {
		old.meta.release(be)
		err := be.g.Do(func(d *kernels.Device) error {
			for _, pl := range old.layers {
				if pl != nil {
					if err := pl.k.Free(); err != nil {
						return err
					}
					if err := pl.v.Free(); err != nil {
						return err
					}
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("cuda: InitKV: freeing the old pool: %w", err)
		}
	}
	be.paged = &pagedKV{blockSize: blockSize, numBlocks: numBlocks}
	be.attnMemo = attnMemo{}
	return nil
}

// KVElemBytes implements backend.KVAllocator: 4 with the float32 cache
// (Options.KVCacheF32), else 2.
func (be *Backend) KVElemBytes() int { return be.kvElem() }

// AllocKV implements backend.KVAllocator: every layer's pool of InitKV's
// blocks, allocated now in device memory. On an error the layers allocated
// by this call are freed again.
func (be *Backend) AllocKV(widths []backend.KVWidth) error {
	be.kvMu.Lock()
	defer be.kvMu.Unlock()
	pk := be.paged
	if pk == nil {
		return fmt.Errorf("cuda: AllocKV before InitKV")
	}
	var made []int
	err := be.g.Do(func(d *kernels.Device) error {
		for _, w := range widths {
			if w.Layer < 0 || w.K <= 0 || w.V < 0 {
				return fmt.Errorf("cuda: AllocKV: layer %d widths %d/%d", w.Layer, w.K, w.V)
			}
			if w.Layer < len(pk.layers) && pk.layers[w.Layer] != nil {
				continue
			}
			layerAt(d, &pk.layers, w.Layer, pk.numBlocks, pk.blockSize, w.K, w.V, be.kvElem())
			made = append(made, w.Layer)
		}
		return nil
	})
	if err != nil {
		be.g.Do(func(d *kernels.Device) error {
			for _, l := range made {
				if pl := pk.layers[l]; pl != nil {
					pl.k.Free()
					pl.v.Free()
					pk.layers[l] = nil
				}
			}
			return nil
		})
		return fmt.Errorf("cuda: allocating the KV cache (%d blocks of %d tokens per layer): %w", pk.numBlocks, pk.blockSize, err)
	}
	return nil
}

// CopyBlocks copies blocks src[i] → dst[i] in every allocated layer of the
// paged pool.
func (be *Backend) CopyBlocks(src, dst []int32) {
	if len(src) != len(dst) {
		panicf("CopyBlocks", "%d sources, %d destinations", len(src), len(dst))
	}
	be.kvMu.Lock()
	defer be.kvMu.Unlock()
	pk := be.paged
	if pk == nil {
		panicf("CopyBlocks", "no paged KV cache (call InitKV)")
	}
	for i := range src {
		if s, d := src[i], dst[i]; s < 0 || int(s) >= pk.numBlocks || d < 0 || int(d) >= pk.numBlocks {
			panicf("CopyBlocks", "block %d → %d outside the pool of %d", s, d, pk.numBlocks)
		}
	}
	bs := int64(pk.blockSize)
	runs := blockRuns(src, dst)
	be.do("CopyBlocks", func(d *kernels.Device) error {
		for _, pl := range pk.layers {
			if pl == nil {
				continue
			}
			for _, r := range runs {
				for _, m := range []struct {
					buf *kernels.Buffer
					w   int64
				}{{pl.k, int64(pl.kw)}, {pl.v, int64(pl.vw)}} {
					if m.w == 0 {
						continue // values inside the keys
					}
					n := bs * m.w * int64(pl.elem) // bytes a block
					sv, err := m.buf.View(int64(r.src)*n, int64(r.n)*n)
					if err != nil {
						return err
					}
					dv, err := m.buf.View(int64(r.dst)*n, int64(r.n)*n)
					if err != nil {
						return err
					}
					if err := d.CopyAsync(nil, dv, sv, int64(r.n)*n); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
}

// blockRun is n consecutive blocks copied src… → dst….
type blockRun struct{ src, dst, n int32 }

// blockRuns groups the block copies src[i] → dst[i] into runs of
// consecutive ids on both sides, one copy each, in order (self-copies
// dropped). A run never lets its source and destination ranges overlap, so
// each run copies exactly what its blocks copied one by one, in the order
// given.
func blockRuns(src, dst []int32) []blockRun {
	var runs []blockRun
	for i := range src {
		if src[i] == dst[i] {
			continue // a block onto itself: nothing to do
		}
		if k := len(runs) - 1; k >= 0 {
			r := &runs[k]
			if src[i] == r.src+r.n && dst[i] == r.dst+r.n {
				lo, hi := max(r.src, r.dst), min(r.src, r.dst)+r.n+1 // ranges after extending
				if lo >= hi {                                        // still disjoint
					r.n++
					continue
				}
			}
		}
		runs = append(runs, blockRun{src: src[i], dst: dst[i], n: 1})
	}
	return runs
}
