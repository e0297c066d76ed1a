package cpu

import (
	"github.com/mkserve/mkserve/attention"
	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/internal/par"
)

// seqCache is one sequence's KV cache, one entry per layer index.
type seqCache struct {
	layers []*layerCache
}

// layerCache holds a layer's keys [tokens, KVH*D] and values [tokens, KVH*Dv].
type layerCache struct {
	k, v   []float32
	kw, vw int // row widths the cache was started with
}

// layer returns the cache of layer l, growing the table as needed.
func (s *seqCache) layer(l int) *layerCache {
	if l >= len(s.layers) {
		s.layers = append(s.layers, make([]*layerCache, l+1-len(s.layers))...)
	}
	if s.layers[l] == nil {
		s.layers[l] = &layerCache{}
	}
	return s.layers[l]
}

// tokens is the number of cached positions.
func (c *layerCache) tokens() int {
	if c.kw == 0 {
		return 0
	}
	return len(c.k) / c.kw
}

// Attention appends k, v to the layer's KV cache for every sequence of the
// batch and attends causally with attention.CausalPaged: q [T, H*D],
// k [T, KVH*D], v [T, KVH*Dv] → [T, H*Dv].
//
// Spans with a block table use the paged pool of InitKV: the new rows are
// written to their blocks and attention reads the blocks in place (the
// ring emulation of context-parallel spans reads a gathered copy). Spans
// without one use the unpaged per-sequence cache described next.
//
// For each span the cache of (span ID, p.Layer) must hold at least Past
// tokens; positions from Past on are replaced by the span's rows (so a
// sequence can be rolled back by resubmitting from an earlier Past). A cache
// holding fewer than Past tokens, rows of another width than the layer's
// first call, a duplicated ID, an invalid batch or bad shapes panic.
// Sequences run concurrently.
func (be *Backend) Attention(q, k, v backend.Tensor, b *backend.Batch, p *backend.AttnParams) backend.Tensor {
	if b == nil || p == nil {
		panicf("Attention", "nil batch or params")
	}
	if err := b.Validate(); err != nil {
		panicf("Attention", "%v", err)
	}
	H, KV, D, Dv := p.NumHeads, p.NumKVHeads, p.HeadDim, p.VHeadDim
	if H <= 0 || KV <= 0 || D <= 0 || Dv <= 0 || p.Layer < 0 {
		panicf("Attention", "layer %d heads %d/%d dims %d/%d", p.Layer, H, KV, D, Dv)
	}
	T := len(b.Tokens)
	qt, qr := matrix("Attention", "q", q, H*D)
	kt, kr := matrix("Attention", "k", k, KV*D)
	vt, vr := matrix("Attention", "v", v, KV*Dv)
	if qr != T || kr != T || vr != T {
		panicf("Attention", "q %v, k %v, v %v for a batch of %d tokens", qt.shape, kt.shape, vt.shape, T)
	}
	params := &attention.Params{
		NumHeads: H, NumKVHeads: KV, HeadDim: D, VHeadDim: Dv,
		Scale: p.Scale, Window: p.Window, Sinks: vector("Attention", "Sinks", p.Sinks, H),
	}
	if err := params.Validate(); err != nil {
		panicf("Attention", "%v", err)
	}
	if err := p.CheckValuesInKeys(); err != nil {
		panicf("Attention", "%v", err)
	}

	hist := be.appendLayerKV("Attention", b, p, kt.data, vt.data) // views of the caches

	out := newTensor(T, H*Dv)
	run := func(i int) {
		s := b.Seqs[i]
		o, qs := out.data[s.Offset*H*Dv:(s.Offset+s.Len)*H*Dv], qt.data[s.Offset*H*D:(s.Offset+s.Len)*H*D]
		if s.ContextParallel > 1 {
			// R emulated ranks: the ring schedule of the GPU kernel.
			k, v := hist[i].Gather(s.Past+s.Len, KV*D, KV*Dv)
			attention.RingCausal(o, qs, k, v, s.Len, s.Past, s.ContextParallel, params, true)
			return
		}
		attention.CausalPaged(o, qs, &hist[i], s.Len, s.Past, params) // the pool in place
	}
	// attention.Causal spreads one sequence over all cores; several short
	// sequences (decode) also run side by side.
	par.Each(len(b.Seqs), run)
	return out
}

// appendLayerKV is appendKV for layer p: its widths, and no values stored
// where p keeps them inside the keys.
func (be *Backend) appendLayerKV(op string, b *backend.Batch, p *backend.AttnParams, k, v []float32) []attention.Pool {
	kw, vw := p.NumKVHeads*p.HeadDim, p.NumKVHeads*p.VHeadDim
	if p.ValuesInKeys {
		v, vw = nil, 0
	}
	return be.appendKV(op, b, p.Layer, k, v, kw, vw)
}

// appendKV appends each span's new rows of k [T, kw] and v [T, vw] to
// layer's KV cache (paged spans: into their blocks) and returns a view of
// every span's whole history, Past+Len positions: the pool and the span's
// block table, or the unpaged cache as one block. vw 0 (v nil): the values
// are each key's first columns (attention.Pool.ValuesInKeys). It holds the
// cache lock only while it appends; it panics, naming op, on the errors
// Attention lists.
func (be *Backend) appendKV(op string, b *backend.Batch, layer int, k, v []float32, kw, vw int) []attention.Pool {
	hist := make([]attention.Pool, len(b.Seqs))
	be.kvMu.Lock()
	seen := make(map[uint64]bool, len(b.Seqs))
	for i, s := range b.Seqs {
		if seen[s.ID] {
			be.kvMu.Unlock()
			panicf(op, "sequence %d appears twice in the batch", s.ID)
		}
		seen[s.ID] = true
		if s.Blocks != nil {
			if be.paged == nil {
				be.kvMu.Unlock()
				panicf(op, "span %d has a block table but no paged KV cache exists (call InitKV)", i)
			}
			pl := be.paged.layer(layer, kw, vw)
			be.paged.write(pl, s, k[s.Offset*kw:(s.Offset+s.Len)*kw], v[s.Offset*vw:(s.Offset+s.Len)*vw])
			hist[i] = be.paged.pool(pl, s.Blocks, vw == 0)
			continue
		}
		sc := be.kv[s.ID]
		if sc == nil {
			sc = &seqCache{}
			be.kv[s.ID] = sc
		}
		c := sc.layer(layer)
		if c.kw == 0 {
			c.kw, c.vw = kw, vw
		}
		if c.kw != kw || c.vw != vw || c.tokens() < s.Past {
			cached, ckw, cvw := c.tokens(), c.kw, c.vw
			be.kvMu.Unlock()
			panicf(op, "sequence %d layer %d: cache holds %d tokens of widths %d/%d, span wants past %d of widths %d/%d",
				s.ID, layer, cached, ckw, cvw, s.Past, kw, vw)
		}
		c.k = append(c.k[:s.Past*kw], k[s.Offset*kw:(s.Offset+s.Len)*kw]...)
		c.v = append(c.v[:s.Past*vw], v[s.Offset*vw:(s.Offset+s.Len)*vw]...)
		hist[i] = attention.Pool{K: c.k, V: c.v, Blocks: []int32{0}, BlockSize: max(s.Past+s.Len, 1), ValuesInKeys: vw == 0}
	}
	be.kvMu.Unlock()
	return hist
}

// FreeSequence drops every layer's KV cache of sequence id.
func (be *Backend) FreeSequence(id uint64) {
	be.kvMu.Lock()
	delete(be.kv, id)
	be.kvMu.Unlock()
}

// cachedTokens is the number of tokens cached for (id, layer); for tests.
func (be *Backend) cachedTokens(id uint64, layer int) int {
	be.kvMu.Lock()
	defer be.kvMu.Unlock()
	sc := be.kv[id]
	if sc == nil || layer >= len(sc.layers) || sc.layers[layer] == nil {
		return 0
	}
	return sc.layers[layer].tokens()
}
