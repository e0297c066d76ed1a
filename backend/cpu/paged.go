package cpu

import (
	"fmt"

	"github.com/mkserve/mkserve/attention"
	"github.com/mkserve/mkserve/backend"
	"github.com/mkserve/mkserve/tensor"
)

// toBF16 writes src's values rounded to bf16 (nearest even) to dst.
func toBF16(dst []uint16, src []float32) {
	for i, x := range src {
		dst[i] = tensor.F32ToBF16(x)
	}
}

// pagedKV is the paged KV cache: per layer a pool of blocks, each
// [blockSize, width] for keys and for values, allocated on the layer's first
// use (when its widths are known).
type pagedKV struct {
	blockSize, numBlocks int
	bf16                 bool // Options.KVBF16: rows kept in bf16
	layers               []*pagedLayer
}

type pagedLayer struct {
	kw, vw   int
	k, v     []float32 // [numBlocks*blockSize, kw], [numBlocks*blockSize, vw]
	k16, v16 []uint16  // the same in bf16, instead (pagedKV.bf16)
}

// pool is layer pl seen as attention's pool of a sequence with block table
// blocks (valuesInKeys: its values live in its keys, vw = 0).
func (p *pagedKV) pool(pl *pagedLayer, blocks []int32, valuesInKeys bool) attention.Pool {
	return attention.Pool{K: pl.k, V: pl.v, K16: pl.k16, V16: pl.v16, Blocks: blocks, BlockSize: p.blockSize, ValuesInKeys: valuesInKeys}
}

// KVElemBytes implements backend.KVAllocator: 2 with Options.KVBF16, else 4.
func (be *Backend) KVElemBytes() int {
	if be.opts.KVBF16 {
		return 2
	}
	return 4
}

// AllocKV implements backend.KVAllocator: every layer's pool of InitKV's
// blocks, allocated now.
func (be *Backend) AllocKV(widths []backend.KVWidth) error {
	be.kvMu.Lock()
	defer be.kvMu.Unlock()
	if be.paged == nil {
		return fmt.Errorf("cpu: AllocKV before InitKV")
	}
	for _, w := range widths {
		if w.Layer < 0 || w.K <= 0 || w.V < 0 {
			return fmt.Errorf("cpu: AllocKV: layer %d widths %d/%d", w.Layer, w.K, w.V)
		}
		be.paged.layer(w.Layer, w.K, w.V)
	}
	return nil
}

// InitKV allocates a pool of numBlocks blocks of blockSize tokens per layer.
func (be *Backend) InitKV(blockSize, numBlocks int) error {
	if blockSize <= 0 || numBlocks <= 0 {
		return fmt.Errorf("cpu: InitKV: block size %d and block count %d must be positive", blockSize, numBlocks)
	}
	be.kvMu.Lock()
	be.paged = &pagedKV{blockSize: blockSize, numBlocks: numBlocks, bf16: be.opts.KVBF16}
	be.kvMu.Unlock()
	return nil
}

// layer returns layer l's pool, allocating it with widths kw, vw.
func (p *pagedKV) layer(l, kw, vw int) *pagedLayer {
	if l >= len(p.layers) {
		p.layers = append(p.layers, make([]*pagedLayer, l+1-len(p.layers))...)
	}
	pl := p.layers[l]
	if pl == nil {
		rows := p.blockSize * p.numBlocks
		pl = &pagedLayer{kw: kw, vw: vw}
		if p.bf16 {
			pl.k16, pl.v16 = make([]uint16, rows*kw), make([]uint16, rows*vw)
		} else {
			pl.k, pl.v = make([]float32, rows*kw), make([]float32, rows*vw)
		}
		p.layers[l] = pl
	}
	if pl.kw != kw || pl.vw != vw {
		panicf("Attention", "layer %d: paged cache widths %d/%d, span wants %d/%d", l, pl.kw, pl.vw, kw, vw)
	}
	return pl
}

// row is the pool row holding position pos of a sequence with block table blocks.
func (p *pagedKV) row(blocks []int32, pos int) int {
	b := pos / p.blockSize
	if b >= len(blocks) {
		panicf("Attention", "position %d needs block %d, the block table has %d", pos, b, len(blocks))
	}
	id := int(blocks[b])
	if id < 0 || id >= p.numBlocks {
		panicf("Attention", "block id %d outside the pool of %d", id, p.numBlocks)
	}
	return id*p.blockSize + pos%p.blockSize
}

// write stores span s's new rows (kNew [Len, kw], vNew [Len, vw]) in the
// pool at their blocks.
func (p *pagedKV) write(pl *pagedLayer, s backend.SeqSpan, kNew, vNew []float32) {
	kw, vw := pl.kw, pl.vw
	for j := 0; j < s.Len; j++ {
		r := p.row(s.Blocks, s.Past+j)
		if p.bf16 { // rounded to nearest even, as bf16 checkpoints are
			toBF16(pl.k16[r*kw:(r+1)*kw], kNew[j*kw:(j+1)*kw])
			toBF16(pl.v16[r*vw:(r+1)*vw], vNew[j*vw:(j+1)*vw])
			continue
		}
		copy(pl.k[r*kw:(r+1)*kw], kNew[j*kw:(j+1)*kw])
		copy(pl.v[r*vw:(r+1)*vw], vNew[j*vw:(j+1)*vw])
	}
}

// CopyBlocks copies blocks src[i] → dst[i] in every allocated layer.
func (be *Backend) CopyBlocks(src, dst []int32) {
	if len(src) != len(dst) {
		panicf("CopyBlocks", "%d sources, %d destinations", len(src), len(dst))
	}
	be.kvMu.Lock()
	defer be.kvMu.Unlock()
	p := be.paged
	if p == nil {
		panicf("CopyBlocks", "no paged KV cache (call InitKV)")
	}
	bs := p.blockSize
	for i := range src {
		s, d := int(src[i]), int(dst[i])
		if s < 0 || s >= p.numBlocks || d < 0 || d >= p.numBlocks {
			panicf("CopyBlocks", "block %d → %d outside the pool of %d", s, d, p.numBlocks)
		}
		for _, pl := range p.layers {
			if pl == nil {
				continue
			}
			if p.bf16 {
				copy(pl.k16[d*bs*pl.kw:(d+1)*bs*pl.kw], pl.k16[s*bs*pl.kw:(s+1)*bs*pl.kw])
				copy(pl.v16[d*bs*pl.vw:(d+1)*bs*pl.vw], pl.v16[s*bs*pl.vw:(s+1)*bs*pl.vw])
				continue
			}
			copy(pl.k[d*bs*pl.kw:(d+1)*bs*pl.kw], pl.k[s*bs*pl.kw:(s+1)*bs*pl.kw])
			copy(pl.v[d*bs*pl.vw:(d+1)*bs*pl.vw], pl.v[s*bs*pl.vw:(s+1)*bs*pl.vw])
		}
	}
}
