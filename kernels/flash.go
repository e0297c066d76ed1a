package kernels

import (
	"fmt"
	"math"
)

// Flash attention for prefill (flash.cu, mk_flash.h): one launch serves
// every sequence of an engine step.

// flashAttnBF16 binds mk_flash_attn_bf16.
var flashAttnBF16 func(s, out uint64, outDType int32, q, poolK, poolV, qStart, past, table, blocks uint64,
	blockSize, batch, maxQLen, heads, kvHeads, headDim, vHeadDim int32, scale uint32, window int32,
	sinks uint64, causal int32) int32

func init() {
	registerSymbols(symbol{"mk_flash_attn_bf16", &flashAttnBF16})
}

// FlashMaxHeadDim is the largest head dim (and value head dim) FlashAttention takes.
const FlashMaxHeadDim = 256

// FlashArgs describes one FlashAttention launch. The counts Tokens,
// PoolRows and NumBlocks size-check the buffers; the int32 contents of
// qStart, past, table and blocks are trusted.
type FlashArgs struct {
	Batch   int // sequences
	MaxQLen int // at least every sequence's query rows (rows past it are not computed)
	Tokens  int // rows of q and out

	Heads, KVHeads    int // Heads a multiple of KVHeads (GQA)
	HeadDim, VHeadDim int // 1..FlashMaxHeadDim; VHeadDim may differ (MLA)

	BlockSize int // > 0: paged KV (blocks); 0: contiguous, table holds kv_start
	PoolRows  int // rows of poolK and poolV
	NumBlocks int // entries of blocks (paged only)

	Scale  float32 // softmax scale, finite and > 0
	Window int     // sliding window in keys (0: none; causal only)
	Causal bool
	Out    DType // BF16 or F32
}

// FlashAttention computes softmax(q·kᵀ·scale)·v for a varlen batch on bf16
// tensor cores (float32 accumulation):
//
//	q      [Tokens, Heads*HeadDim] bf16     out [Tokens, Heads*VHeadDim] (a.Out)
//	poolK  [PoolRows, KVHeads*HeadDim] bf16 poolV [PoolRows, KVHeads*VHeadDim] bf16
//	qStart [Batch+1] int32: sequence b owns q rows qStart[b]..qStart[b+1]-1
//	past   [Batch] int32: its first row is at position past[b]
//	table  [Batch] int32: paged, offsets into blocks [NumBlocks] int32; contiguous, kv_start
//	sinks  [Heads] float32 or nil: join each row's softmax denominator
//
// Causal rows attend keys max(0, p-Window+1)..p at position p; non-causal
// rows attend every key 0..past[b]+len_b-1. Key j of sequence b is pool row
// blocks[table[b]+j/BlockSize]*BlockSize + j%BlockSize (paged) or
// table[b]+j (contiguous). Query head h reads kv head h/(Heads/KVHeads).
func (d *Device) FlashAttention(s *Stream, out, q, poolK, poolV, qStart, past, table, blocks, sinks *Buffer,
	a FlashArgs) error {
	const op = "FlashAttention"
	if err := d.ready(op); err != nil || d.muted() {
		return err
	}
	if err := a.check(); err != nil {
		return err
	}
	T, P := int64(a.Tokens), int64(a.PoolRows)
	if err := need(op, "q", q, T*int64(a.Heads*a.HeadDim), 2); err != nil {
		return err
	}
	if err := need(op, "out", out, T*int64(a.Heads*a.VHeadDim), a.Out.size()); err != nil {
		return err
	}
	if err := needAll(op, 2, "poolK", poolK, P*int64(a.KVHeads*a.HeadDim),
		"poolV", poolV, P*int64(a.KVHeads*a.VHeadDim)); err != nil {
		return err
	}
	B := int64(a.Batch)
	if err := needAll(op, 4, "qStart", qStart, B+1, "past", past, B, "table", table, B); err != nil {
		return err
	}
	var bl uint64
	if a.BlockSize > 0 {
		if err := need(op, "blocks", blocks, int64(a.NumBlocks), 4); err != nil {
			return err
		}
		bl = blocks.ptr
	}
	var sk uint64
	if sinks != nil {
		if err := need(op, "sinks", sinks, int64(a.Heads), 4); err != nil {
			return err
		}
		sk = sinks.ptr
	}
	causal := int32(0)
	if a.Causal {
		causal = 1
	}
	return d.lib.check("mk_flash_attn_bf16", flashAttnBF16(s.handle(), out.ptr, int32(a.Out), q.ptr, poolK.ptr,
		poolV.ptr, qStart.ptr, past.ptr, table.ptr, bl, int32(a.BlockSize), int32(a.Batch), int32(a.MaxQLen),
		int32(a.Heads), int32(a.KVHeads), int32(a.HeadDim), int32(a.VHeadDim), math.Float32bits(a.Scale),
		int32(a.Window), sk, causal))
}

// check validates the shape arguments (the buffers are checked by the caller).
func (a FlashArgs) check() error {
	const op = "FlashAttention"
	if err := dims(op, "Batch", a.Batch, "MaxQLen", a.MaxQLen, "Tokens", a.Tokens, "Heads", a.Heads,
		"KVHeads", a.KVHeads, "HeadDim", a.HeadDim, "VHeadDim", a.VHeadDim, "PoolRows", a.PoolRows); err != nil {
		return err
	}
	switch {
	case a.Batch > 65535:
		return fmt.Errorf("kernels: %s: Batch=%d > 65535", op, a.Batch)
	case a.Heads > 65535:
		return fmt.Errorf("kernels: %s: Heads=%d > 65535", op, a.Heads)
	case a.Heads%a.KVHeads != 0:
		return fmt.Errorf("kernels: %s: Heads=%d is not a multiple of KVHeads=%d", op, a.Heads, a.KVHeads)
	case a.HeadDim > FlashMaxHeadDim || a.VHeadDim > FlashMaxHeadDim:
		return fmt.Errorf("kernels: %s: HeadDim=%d, VHeadDim=%d: at most %d", op, a.HeadDim, a.VHeadDim, FlashMaxHeadDim)
	case a.BlockSize < 0:
		return fmt.Errorf("kernels: %s: BlockSize=%d must be >= 0 (0: contiguous)", op, a.BlockSize)
	case a.BlockSize > 0 && a.NumBlocks <= 0:
		return fmt.Errorf("kernels: %s: paged (BlockSize=%d) needs NumBlocks > 0, got %d", op, a.BlockSize, a.NumBlocks)
	case a.Window < 0 || a.Window > math.MaxInt32:
		return fmt.Errorf("kernels: %s: Window=%d must be in [0, 2^31)", op, a.Window)
	case a.Window > 0 && !a.Causal:
		return fmt.Errorf("kernels: %s: Window=%d needs Causal", op, a.Window)
	case !(a.Scale > 0) || math.IsInf(float64(a.Scale), 0):
		return fmt.Errorf("kernels: %s: Scale=%v must be finite and > 0", op, a.Scale)
	case a.Out != BF16 && a.Out != F32:
		return fmt.Errorf("kernels: %s: Out=%d is not BF16 or F32", op, a.Out)
	case a.BlockSize > math.MaxInt32:
		return fmt.Errorf("kernels: %s: BlockSize=%d >= 2^31", op, a.BlockSize)
	}
	return nil
}
